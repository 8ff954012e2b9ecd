"""Remove sandboxes (containers and their workspace volumes) that a crashed worker left behind.

Usage: python -m executor.reap [--older-than SECONDS] [--evaluation ID]

Best-effort stop is the executor's job; this is the safety net. It only touches what carries the
project's sandbox labels, and by default only what is older than an hour (a running session is younger).
"""

import argparse
import sys

from executor.settings import ExecutorSettings
from services.sandbox.registry import get_backend

DEFAULT_REAP_AGE_S = 3600.0
"""Sandboxes younger than this are left alone by default: they may belong to a running session."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Remove leftover pybench-eval sandboxes.")
    parser.add_argument("--older-than", type=float, default=DEFAULT_REAP_AGE_S, help="seconds (default 3600)")
    parser.add_argument("--evaluation", default=None, help="only the sandboxes of this evaluation")
    args = parser.parse_args(argv)
    removed = get_backend(ExecutorSettings()).reap(evaluation_id=args.evaluation, older_than_s=args.older_than)
    for name in removed:
        print(f"removed {name}")
    print(f"{len(removed)} sandbox object(s) removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
