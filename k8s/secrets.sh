#!/usr/bin/env bash
# Make the stack's secrets and store them in the cluster as the one Secret pybench-eval-secrets in namespace
# pybench-eval; nothing in k8s/ holds a secret. The keys:
#   PBE_ADMIN_KEY       the gateway's admin API key (send it as Authorization: Bearer <key>)
#   PBE_REDIS_PASSWORD  Redis's password (Redis refuses to start without one; the services' URLs carry it)
#   PBE_SECRETS_KEY     the key that seals the model and judge API keys held in Redis
# They are kept, readable by you only, in the file given as $1 (default var/k8s-secrets.env): a value already
# there is kept, so running this again changes nothing that works.
#
#   k8s/secrets.sh                  create or replace the Secret (kubectl's current context)
#   k8s/secrets.sh FILE --print     print the Secret's manifest instead of applying it (to seal or store it the
#                                   way your cluster's secrets go)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-var/k8s-secrets.env}"
mode="${2:-apply}"
mkdir -p "$(dirname "$out")"
PYTHON="${PYTHON:-python3}" bash "$here/../scripts/env-file.sh" "$out" >&2
manifest() {
  kubectl create secret generic pybench-eval-secrets --namespace pybench-eval \
    --from-env-file="$out" --dry-run=client -o yaml
}
if [ "$mode" = "--print" ]; then
  manifest
else
  manifest | kubectl apply -f -
  echo "the secrets are in $out (the admin key: send it as Authorization: Bearer <key>); restart to pick up new ones:" >&2
  echo "  kubectl -n pybench-eval rollout restart deployment statefulset" >&2
fi
