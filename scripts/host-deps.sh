#!/usr/bin/env bash
# Check that the host has what a make target needs, before anything long starts; as root with apt-get, install
# what is missing from Debian's packages, else name it in one message and fail.
#
#   scripts/host-deps.sh [docker] [debootstrap] [redis-server] [venv] [chromium] [chromedriver] ...
set -euo pipefail
python="${PYTHON:-python3}"
missing=() packages=()
for need in "$@"; do
  case "$need" in
    docker)
      if ! command -v docker >/dev/null; then
        echo "error: no docker command: install Docker Engine (https://docs.docker.com/engine/install/) and start it" >&2
        exit 1
      fi
      if ! docker info >/dev/null 2>&1; then
        echo "error: the Docker engine does not answer: start it (systemctl start docker), or add $(id -un) to the" \
          "docker group and log in again" >&2
        exit 1
      fi ;;
    venv)
      "$python" -c 'import ensurepip, venv' 2>/dev/null || { missing+=(venv); packages+=(python3-venv); } ;;
    chromedriver)
      command -v chromedriver >/dev/null || { missing+=(chromedriver); packages+=(chromium-driver); } ;;
    *)
      command -v "$need" >/dev/null || { missing+=("$need"); packages+=("$need"); } ;;
  esac
done
((${#missing[@]})) || exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing from Debian's packages: ${packages[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
  exit 0
fi
echo "error: this needs ${missing[*]}, which this machine lacks; install them first:" \
  "sudo apt-get install -y ${packages[*]}   (then run the same make command again)" >&2
exit 1
