"""The files a grading sandbox gets for one session: what the session produced, and the inputs checks compare to.

Produced files come from the artifact store (``./output/...``); inputs come from the suite (``./data/...``),
only those a check names, so a session's grading copies megabytes, not the suite. The ``original`` grading may
also see files other tasks of the evaluation produced (``grader.shared_output``): they go in under their names.
Files are keyed by their workspace-relative name (``output/2.csv``, ``data/80.jpeg``); a folder's name ends with
``/`` (so an empty one is there too).
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from services.errors import SuiteError
from services.pybench.suite import Suite

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


def gather(
    output_dir: Path, suite: Suite, checks: list[dict[str, Any]], borrowed: Mapping[str, Path] | None = None
) -> dict[str, bytes]:
    """Read the session's produced files under ``output_dir`` and the suite inputs ``checks`` name.

    ``borrowed``: other tasks' files by ``./output/...`` name (a name ending in ``/`` is a folder); each replaces
    the session's own file of that name. A named input that is not in the suite is left out (the check that needs
    it fails with its reason). Symbolic links are not followed. Never raises for a missing folder or file.
    """
    files: dict[str, bytes] = {}
    budget = MAX_GRADING_BYTES
    for name, path in sorted((borrowed or {}).items()):
        relative = "output/" + name.removeprefix("./").removeprefix("output/")
        if relative.endswith("/"):
            files[relative] = b""
        elif path.is_file() and not path.is_symlink() and path.stat().st_size <= budget:
            budget -= path.stat().st_size
            files[relative] = path.read_bytes()
    if output_dir.is_dir():
        for path in sorted(output_dir.rglob("*")):
            name = "output/" + path.relative_to(output_dir).as_posix()
            if path.is_dir() and not path.is_symlink():
                files[name + "/"] = b""  # a folder, even empty
            elif path.is_file() and not path.is_symlink() and name not in files:
                size = path.stat().st_size
                if size > budget:
                    continue
                budget -= size
                files[name] = path.read_bytes()
    for name in sorted(referenced_inputs(checks)):
        try:
            path = suite.input_file(name)
        except SuiteError:
            continue
        if path.is_file() and path.stat().st_size <= budget:
            budget -= path.stat().st_size
            files[name.removeprefix("./")] = path.read_bytes()
    return files
