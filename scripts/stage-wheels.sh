#!/usr/bin/env bash
# Download a wheelhouse for the images' interpreter, so image builds need no network.
#
# Usage: scripts/stage-wheels.sh DEST [pip requirement arguments...]
#   e.g. scripts/stage-wheels.sh services/sandbox/image/staged/wheels -r reqs.txt
#
# The images run Debian bookworm's CPython 3.11.2 (or the public image's 3.11.x): wheels are chosen for
# 3.11.2 on manylinux x86_64, not for the host's interpreter (newest releases of some packages need
# >= 3.11.5). A requirement published only as a source archive is built into a wheel on the host.
# Skips the download when the same requirements were staged before: the key is the arguments, each file among
# them by its content (not its path, so moving a requirements file keeps the wheelhouse).
set -euo pipefail
dest="$1"; shift
mkdir -p "$dest"
key="$(for arg in "$@"; do if [ -f "$arg" ]; then cat "$arg"; else printf '%s\n' "$arg"; fi; done | sha256sum | cut -c1-16)"
if [ -f "$dest/.complete" ] && [ "$(cat "$dest/.complete")" = "$key" ]; then
  echo "wheelhouse $dest is up to date"
  exit 0
fi
platform=(--only-binary=:all: --python-version 3.11.2 --implementation cp --abi cp311
          --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux_2_28_x86_64 --platform linux_x86_64 --platform any)
for attempt in $(seq 1 10); do
  if pip download -q --disable-pip-version-check -d "$dest" --find-links "$dest" "${platform[@]}" "$@" 2>"$dest/.log"; then
    echo "$key" > "$dest/.complete"
    echo "wheelhouse $dest: $(ls "$dest"/*.whl | wc -l) wheels"
    exit 0
  fi
  missing="$(grep -oP 'No matching distribution found for \K\S+' "$dest/.log" | head -n 1 || true)"
  if [ -z "$missing" ]; then
    cat "$dest/.log" >&2
    echo "pip download failed: is PyPI reachable from this host?" >&2
    exit 1
  fi
  echo "no wheel published for $missing: building one on the host"
  pip wheel -q --disable-pip-version-check --no-deps -w "$dest" "$missing"
done
echo "gave up after 10 rounds of building missing wheels; see $dest/.log" >&2
exit 1
