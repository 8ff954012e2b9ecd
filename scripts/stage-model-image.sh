#!/usr/bin/env bash
# Stage what docker/llama/Dockerfile installs offline: the llama-cpp-python wheel compiled on the host
# (var/wheels, `scripts/install-real-model.sh --wheel`), its dependencies' wheels for Python 3.11.2, and the
# Debian packages of the shared libraries it links (libgomp1, libssl3) for the local bookworm base image.
set -euo pipefail
cd "$(dirname "$0")/.."
staged=docker/llama/staged
mkdir -p "$staged/wheels" "$staged/debs"
wheel="$(compgen -G 'var/wheels/llama_cpp_python-*.whl' | head -n 1 || true)"
[ -n "$wheel" ] || { echo "no llama-cpp-python wheel in var/wheels: run scripts/install-real-model.sh --wheel" >&2; exit 1; }
cp -u "$wheel" "$staged/wheels/"
# The server's dependencies (the compiled wheel is found in the wheelhouse, not downloaded).
bash scripts/stage-wheels.sh "$staged/wheels" -r docker/llama/requirements.txt
if [ -z "$(compgen -G "$staged/debs/libgomp1_*.deb" || true)" ]; then
  (cd "$staged/debs" && apt-get download libgomp1 libssl3 >/dev/null)
fi
echo "staged for the model image: $(ls "$staged/wheels"/*.whl | wc -l) wheels, $(ls "$staged/debs"/*.deb | wc -l) packages"
