"""The checks that run in the grader's own process: on the answer text and the names of the produced files.

Task checks are data (``checks.json`` of the suite): ``{"kind": "file_exists", "paths": [...]}``. The kinds
here never open a produced file; every other kind does, and runs in a grading sandbox
(``grader.file_checks`` inside a container or pod, driven by ``services.sandbox.grading``). Malformed parameters
give a failed check with the reason. No check raises.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from services.verdict import CheckResult


@dataclass(frozen=True)
class CheckContext:
    """What a check may look at: the answer, and the files the session produced under ``./output``."""

    answer: str
    output_files: frozenset[str] = field(default_factory=frozenset)


class CheckParameterError(ValueError):
    """A check's parameters are not what its kind needs."""


def normalise_output_path(path: str) -> str:
    """Spell a produced file's name one way: ``output/x.png``, ``./output/x.png`` -> ``./output/x.png``."""
    return "./" + path.removeprefix("./").lstrip("/")


def _strings(check: dict[str, Any], name: str) -> list[str]:
    value = check.get(name)
    if not isinstance(value, list) or not value or not all(isinstance(item, str) for item in value):
        raise CheckParameterError(f"{check.get('kind')} needs '{name}': a non-empty list of strings, got {value!r}")
    return value


def answer_contains_all(check: dict[str, Any], context: CheckContext) -> CheckResult:
    """Every string of ``strings`` occurs in the answer."""
    missing = [s for s in _strings(check, "strings") if s not in context.answer]
    detail = "all strings found" if not missing else f"missing from the answer: {missing}"
    return CheckResult(kind="answer_contains_all", passed=not missing, detail=detail)


def answer_contains_any(check: dict[str, Any], context: CheckContext) -> CheckResult:
    """At least one string of ``strings`` occurs in the answer."""
    found = [s for s in _strings(check, "strings") if s in context.answer]
    detail = f"found {found[0]!r}" if found else "none of the strings is in the answer"
    return CheckResult(kind="answer_contains_any", passed=bool(found), detail=detail)


def file_exists(check: dict[str, Any], context: CheckContext) -> CheckResult:
    """Each path of ``paths`` (``./output/...``) is among the files the session produced."""
    missing = [p for p in _strings(check, "paths") if normalise_output_path(p) not in context.output_files]
    detail = "all files produced" if not missing else f"not produced: {missing}"
    return CheckResult(kind="file_exists", passed=not missing, detail=detail)


def file_exists_any(check: dict[str, Any], context: CheckContext) -> CheckResult:
    """At least one path of ``paths`` is among the files the session produced."""
    found = [p for p in _strings(check, "paths") if normalise_output_path(p) in context.output_files]
    detail = f"produced {found[0]}" if found else f"none produced of {check['paths']}"
    return CheckResult(kind="file_exists_any", passed=bool(found), detail=detail)


def path_exists(check: dict[str, Any], context: CheckContext) -> CheckResult:
    """``path`` exists as ``os.path.exists`` sees it: a produced file of that name, or a folder of that name (one
    with files in it, or an empty one). What PyBench's test of task 140 asks, where a plain file passes too."""
    value = check.get("path")
    if not isinstance(value, str) or not value.strip("./"):
        raise CheckParameterError(f"path_exists needs 'path': a path under ./output, got {value!r}")
    name = normalise_output_path(value).rstrip("/")
    as_file = name in context.output_files
    in_folder = any(produced.startswith(name + "/") for produced in context.output_files)
    if as_file or in_folder:
        what = "a file" if as_file else "a folder"
        return CheckResult(kind="path_exists", passed=True, detail=f"{value} exists ({what})")
    return CheckResult(kind="path_exists", passed=False, detail=f"the session produced nothing at {value}")


CHECKS: dict[str, Callable[[dict[str, Any], CheckContext], CheckResult]] = {
    "answer_contains_all": answer_contains_all,
    "answer_contains_any": answer_contains_any,
    "file_exists": file_exists,
    "file_exists_any": file_exists_any,
    "path_exists": path_exists,
}
"""The in-process check kinds by name."""


def runs_in_process(check: dict[str, Any]) -> bool:
    """Whether ``check`` runs here (else it opens produced files and runs in a grading sandbox)."""
    return str(check.get("kind", "")) in CHECKS


def run_check(check: dict[str, Any], context: CheckContext) -> CheckResult:
    """Run one in-process check; never raises.

    Returns:
        The result: ``passed`` None for a kind that does not run in process, False with the reason for bad
        parameters.
    """
    kind = str(check.get("kind", ""))
    function = CHECKS.get(kind)
    if function is None:
        return CheckResult(kind=kind, passed=None, detail=f"check kind {kind!r} does not run in the grader's process")
    try:
        return function(check, context)
    except CheckParameterError as exc:
        return CheckResult(kind=kind, passed=False, detail=f"malformed check: {exc}")
