#!/usr/bin/env bash
# Make the gateway's admin API key and store it in the cluster as the Secret pybench-eval-admin (key
# PBE_ADMIN_KEY) in namespace pybench-eval; nothing in k8s/ holds a key. The key is also written, readable by
# you only, to the file given as $1 (default var/k8s-admin.env) so you can send it as `Authorization: Bearer`.
#
#   k8s/admin-secret.sh                  create or replace the Secret (kubectl's current context)
#   k8s/admin-secret.sh FILE --print     write the key to FILE and print the Secret's manifest instead of
#                                        applying it (to seal or store it the way your cluster's secrets go)
set -euo pipefail
out="${1:-var/k8s-admin.env}"
mode="${2:-apply}"
mkdir -p "$(dirname "$out")"
key="pbe-admin-$(python3 -c 'import secrets; print(secrets.token_urlsafe(24))')"
(umask 077; echo "PBE_ADMIN_KEY=$key" > "$out")
manifest() {
  kubectl create secret generic pybench-eval-admin --namespace pybench-eval \
    --from-env-file="$out" --dry-run=client -o yaml
}
if [ "$mode" = "--print" ]; then
  manifest
else
  manifest | kubectl apply -f -
  echo "the admin key is in $out (send it as Authorization: Bearer <key>); restart the gateway to pick up a new one:" >&2
  echo "  kubectl -n pybench-eval rollout restart deployment/gateway" >&2
fi
