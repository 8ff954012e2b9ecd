"""Remove grading sandboxes (containers and their volumes, or pods with PBE_GRADING_BACKEND=kubernetes) that a
killed grader left behind.

Usage: python -m grader.reap [--older-than SECONDS]

Each grading sandbox is removed by the call that started it; this is the safety net. It only touches what
carries the grading sandbox's labels, and by default only what is older than ten minutes (a grading in
progress is younger).
"""

import argparse
import sys

from grader.settings import GraderSettings
from services.sandbox.grading_backends import reap_grading_sandboxes

DEFAULT_REAP_AGE_S = 600.0
"""Grading sandboxes younger than this are left alone by default: a grading may be using them."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Remove leftover pybench-eval grading sandboxes.")
    parser.add_argument("--older-than", type=float, default=DEFAULT_REAP_AGE_S, help="seconds (default 600)")
    args = parser.parse_args(argv)
    removed = reap_grading_sandboxes(args.older_than, GraderSettings())
    for name in removed:
        print(f"removed {name}")
    print(f"{len(removed)} grading sandbox object(s) removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
