"""Make, list and revoke the service's API keys (an operator's command, run where Redis is reachable).

Usage:
    python -m gateway.keys create --name alice [--admin]   # prints the key once: keep it
    python -m gateway.keys list
    python -m gateway.keys revoke <id>
"""

import argparse
import sys

from redis import Redis

from gateway.settings import GatewaySettings
from services.live.apikeys import ApiKeyStore


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.keys", description="pybench-eval API keys")
    commands = parser.add_subparsers(dest="command", required=True)
    create = commands.add_parser("create", help="make a key and print it (once)")
    create.add_argument("--name", required=True, help="who or what uses it")
    create.add_argument("--admin", action="store_true", help="an admin key sees every evaluation")
    commands.add_parser("list", help="list keys (never their secrets)")
    revoke = commands.add_parser("revoke", help="revoke a key at once")
    revoke.add_argument("id")
    args = parser.parse_args(argv)
    redis = Redis.from_url(GatewaySettings().REDIS_URL)
    keys = ApiKeyStore(redis)
    if args.command == "create":
        key, plain = keys.create(args.name, admin=args.admin)
        print(plain)
        print(f"made {'admin ' if key.admin else ''}key {key.id} for {key.name!r}; it is shown once", file=sys.stderr)
    elif args.command == "list":
        for key in keys.list():
            state = "revoked" if key.revoked_at else "active"
            print(f"{key.id}  {state:<8} {'admin' if key.admin else 'user ':<6} {key.name}")
    elif not keys.revoke(args.id):
        print(f"no key {args.id!r}; see `python -m gateway.keys list`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
