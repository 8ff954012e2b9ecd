#!/bin/sh
# Start Redis with the password in PBE_REDIS_PASSWORD. The password reaches redis-server on its standard input
# (a config read from `-`), never on its command line, where any process of the host could read it.
# Extra arguments are redis-server's own options (the image's CMD: bind, append-only file, data folder).
set -eu
if [ -z "${PBE_REDIS_PASSWORD:-}" ]; then
  echo "start-redis: PBE_REDIS_PASSWORD is empty; Redis does not start without one (make env writes one into .env;" \
       "on Kubernetes k8s/secrets.sh puts it in the Secret pybench-eval-secrets)" >&2
  exit 64
fi
case "$PBE_REDIS_PASSWORD" in
  *[!A-Za-z0-9_-]*)
    echo "start-redis: PBE_REDIS_PASSWORD may hold only letters, digits, '-' and '_' (it is written into URLs)" >&2
    exit 64 ;;
esac
exec redis-server - "$@" <<CONFIG
requirepass $PBE_REDIS_PASSWORD
CONFIG
