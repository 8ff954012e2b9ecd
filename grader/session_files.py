"""The files a grading sandbox gets for one session: what the session produced, and the inputs checks compare to.

Produced files come from the artifact store (``./output/...``); inputs come from the suite (``./data/...``),
only those a check names, so a session's grading copies megabytes, not the suite. Files are keyed by their
workspace-relative name (``output/2.csv``, ``data/80.jpeg``); a folder's name ends with ``/`` (so an empty one
is there too).
"""

from pathlib import Path
from typing import Any

from services.errors import SuiteError
from services.suite import Suite

MAX_GRADING_BYTES = 512 * 1024 * 1024
"""The most a grading sandbox is given: files past it are left out (the checks that need them fail as missing)."""


def referenced_inputs(checks: list[dict[str, Any]]) -> set[str]:
    """The ``./data/...`` paths any check parameter names."""
    names: set[str] = set()
    for check in checks:
        for value in check.values():
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, str) and item.removeprefix("./").startswith("data/"):
                    names.add("./" + item.removeprefix("./"))
    return names


def gather(output_dir: Path, suite: Suite, checks: list[dict[str, Any]]) -> dict[str, bytes]:
    """Read the session's produced files under ``output_dir`` and the suite inputs ``checks`` name.

    A named input that is not in the suite is left out (the check that needs it fails with its reason).
    Symbolic links are not followed. Never raises for a missing folder or file.
    """
    files: dict[str, bytes] = {}
    budget = MAX_GRADING_BYTES
    if output_dir.is_dir():
        for path in sorted(output_dir.rglob("*")):
            if path.is_dir() and not path.is_symlink():
                files["output/" + path.relative_to(output_dir).as_posix() + "/"] = b""  # a folder, even empty
            elif path.is_file() and not path.is_symlink():
                size = path.stat().st_size
                if size > budget:
                    continue
                budget -= size
                files["output/" + path.relative_to(output_dir).as_posix()] = path.read_bytes()
    for name in sorted(referenced_inputs(checks)):
        try:
            path = suite.input_file(name)
        except SuiteError:
            continue
        if path.is_file() and path.stat().st_size <= budget:
            budget -= path.stat().st_size
            files[name.removeprefix("./")] = path.read_bytes()
    return files
