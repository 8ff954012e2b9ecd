#!/usr/bin/env bash
# Make a local Debian bookworm base image where no image registry is reachable.
#
# Usage: scripts/make-base-image.sh [IMAGE_TAG]   (default: pybench-eval/bookworm-base:latest)
# Does nothing when the image already exists. Needs root and debootstrap (apt-get install debootstrap).
set -euo pipefail
tag="${1:-pybench-eval/bookworm-base:latest}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "base image $tag exists"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "debootstrap is missing: apt-get install -y debootstrap" >&2; exit 1; }
root="$(mktemp -d /tmp/pybench-eval-rootfs.XXXXXX)"
trap 'rm -rf "$root"' EXIT
echo "debootstrap bookworm into $root (about 30 s)"
debootstrap --variant=minbase bookworm "$root" "$mirror" >/dev/null
# Keep images small and apt non-interactive, as the public slim images do.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
tar -C "$root" -c . | docker import \
  --change 'ENV DEBIAN_FRONTEND=noninteractive' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["bash"]' - "$tag" >/dev/null
echo "made base image $tag"
