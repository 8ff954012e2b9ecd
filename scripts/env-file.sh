#!/usr/bin/env bash
# Make .env (or the file given as $1) hold the stack's secrets, each made here only where the file lacks it:
#   PBE_ADMIN_KEY       the operator's admin API key (send it as Authorization: Bearer <key>)
#   PBE_REDIS_PASSWORD  Redis's password (Redis refuses to start without one; the services' URLs carry it)
#   PBE_SECRETS_KEY     the key that seals the model and judge API keys held in Redis (32 bytes, URL-safe base64)
# The file is readable by its owner only; a value already there is never changed (the stack keeps working).
set -euo pipefail
file="${1:-.env}"
PYTHON="${PYTHON:-python3}"
umask 077
touch "$file"
chmod 600 "$file"
token() { "$PYTHON" -c 'import secrets, sys; print(sys.argv[1] + secrets.token_urlsafe(int(sys.argv[2])))' "$@"; }
add() {
  local name="$1" value="$2"
  if ! grep -q "^${name}=." "$file"; then
    sed -i "/^${name}=/d" "$file"
    echo "${name}=${value}" >> "$file"
    echo "wrote a new ${name} into ${file}"
  fi
}
add PBE_ADMIN_KEY "$(token pbe-admin- 24)"
add PBE_REDIS_PASSWORD "$(token "" 32)"
add PBE_SECRETS_KEY "$("$PYTHON" -c 'import base64, os; print(base64.urlsafe_b64encode(os.urandom(32)).decode())')"
