"""The manifest of a run: what an evaluation ran with (the service's version, the suite's content, its tasks, the
system prompt, sampling, limits, mode, the sandbox image, the judge), recorded when it is accepted, and the key that
says which runs are comparable (the leaderboard and ``GET /v1/compare`` take only runs with the same key together).

Every grading adds a record (``GradingRecord``): grading 1 with the manifest, each regrade another
(``start_grading``, from ``services.lifecycle.regrade``). When the evaluation completes under a grading, the
lifecycle fills its records from the verdicts (``record_gradings``): the grader builds that graded them, the checks
hashes they were graded with, and the comparable key, which is ``graded_key`` of the key as submitted.

The comparable key and the checks: the key as submitted covers the suite's content (its checks included), not the
grader's check code. A verdict records the checks it was graded with (``Verdict.checks_hash``, with the check
code's version ``Verdict.checks_version``). While every verdict that checks decided was graded under
``BASELINE_CHECKS_VERSION`` the key stays the one submitted, so runs graded as every run was before the checks were
recorded keep grouping together; once any was graded under another version, the key becomes a hash of the submitted
key and the checks hashes of those verdicts, so runs graded with different checks never share a key.
"""

import functools
import hashlib
import json
import os
import subprocess
from collections.abc import Iterable
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Literal

from services.evaluation import EvaluationCreate, GradingRecord, JudgeConfig, RunManifest
from services.live.components import SANDBOX_IMAGE, judge_prompt_key
from services.pybench.suite import Suite
from services.verdict import Verdict, VerdictStatus

PACKAGE = "pybench-eval"


VERSION_VARIABLE = "PBE_SERVICE_VERSION"
"""Set in the application image at its build (``<version>+<commit>``, from ``make images``)."""

TREE = Path(__file__).resolve().parent.parent

BASELINE_CHECKS_VERSION = 1
"""The check code's version (``grader.grading.CHECKS_VERSION``) every run was graded under before verdicts recorded
their checks: verdicts graded under it leave the comparable key as submitted. It never changes."""


@functools.cache
def service_version() -> str:
    """The running build, ``<version>+<commit>``: the image's ``PBE_SERVICE_VERSION`` where it was built with one;
    else the installed package's version and the checkout's commit (``+unknown`` outside a git checkout, and
    ``unknown`` alone when the package was never installed). Raises nothing."""
    built = os.environ.get(VERSION_VARIABLE, "").strip()
    if built and not built.startswith("unknown"):
        return built
    try:
        version = metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return "unknown"
    return f"{version}+{_commit(TREE)}"


def _commit(tree: Path) -> str:
    """The checkout's commit (12 hex digits, ``.dirty`` with uncommitted changes), or ``unknown``."""
    try:
        head = subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=5
        )
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + (".dirty" if dirty.stdout.strip() else "")


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def comparable_key(
    suite_hash: str,
    tasks: list[int],
    system_prompt_hash: str,
    mode: str,
    max_turns: int,
    budgets: dict[str, float] | None = None,
) -> str:
    """The key of runs that may be ranked together: the same suite content, tasks, prompt, mode and turn limit,
    and the same per-task budgets (runs without budgets keep the key they always had)."""
    identity: dict[str, object] = {
        "suite": suite_hash,
        "tasks": sorted(tasks),
        "prompt": system_prompt_hash,
        "mode": mode,
        "max_turns": max_turns,
    }
    if budgets:
        identity["budgets"] = budgets
    return _sha256(json.dumps(identity, sort_keys=True))[:16]


def build_manifest(body: EvaluationCreate, suite: Suite, tasks: list[int], components: dict[str, str]) -> RunManifest:
    """The manifest of a submission accepted for ``tasks`` of ``suite``; ``components``: what the workers
    advertised (``services.live.components.advertised``).

    Raises:
        SuiteError: the suite has no such prompt.
    """
    suite_hash = suite.content_hash()
    prompt_hash = _sha256(suite.system_prompt(body.prompt))
    judge = body.judge
    key = comparable_key(
        suite_hash,
        tasks,
        prompt_hash,
        body.mode,
        body.max_turns,
        body.budgets.model_dump(exclude_none=True) if body.budgets else None,
    )
    return RunManifest(
        service_version=service_version(),
        suite=suite.name,
        suite_hash=suite_hash,
        tasks_hash=_sha256(",".join(map(str, sorted(tasks)))),
        prompt=body.prompt,
        system_prompt_hash=prompt_hash,
        mode=body.mode,
        sampling=body.sampling,
        max_turns=body.max_turns,
        cell_timeout_s=body.cell_timeout_s,
        sandbox_image=components.get(SANDBOX_IMAGE),
        judge_model=judge.endpoint.model if judge else None,
        judge_mode=judge.mode if judge else None,
        judge_prompt_hash=components.get(judge_prompt_key(judge.mode)) if judge else None,
        comparable_key=key,
        base_key=key,
        gradings=[_record(1, judge)],
    )


def _record(grading: int, judge: JudgeConfig | None) -> GradingRecord:
    graded: list[Literal["checks", "judge"]] = ["checks", "judge"] if judge else ["checks"]
    return GradingRecord(
        grading=grading,
        started_at=datetime.now(UTC),
        graded=graded,
        judge_model=judge.endpoint.model if judge else None,
    )


def start_grading(manifest: RunManifest, grading: int, judge: JudgeConfig | None) -> RunManifest:
    """``manifest`` with the record of ``grading`` (a regrade starting now, judged by ``judge`` when given) added;
    ``base_key`` set where an older manifest lacked it. Raises nothing."""
    return manifest.model_copy(
        update={
            "base_key": manifest.base_key or manifest.comparable_key,
            "gradings": [*manifest.gradings, _record(grading, judge)],
        }
    )


def graded_key(base_key: str, verdicts: Iterable[Verdict]) -> str:
    """The comparable key of runs submitted with ``base_key`` whose current verdicts are ``verdicts``: ``base_key``
    itself while every verdict the checks decided (not unavailable, not an infrastructure error) was graded under
    ``BASELINE_CHECKS_VERSION`` or before checks were recorded; else a hash of ``base_key`` and the sorted checks
    hashes of those verdicts. Raises nothing."""
    decided = [
        v
        for v in verdicts
        if v.checks_hash is not None and v.status not in (VerdictStatus.UNAVAILABLE, VerdictStatus.INFRA_ERROR)
    ]
    if all(v.checks_version == BASELINE_CHECKS_VERSION for v in decided):
        return base_key
    checks = sorted({v.checks_hash for v in decided if v.checks_hash is not None})
    return _sha256(json.dumps({"key": base_key, "checks": checks}, sort_keys=True))[:16]


def record_gradings(manifest: RunManifest, grading: int, verdicts: list[Verdict]) -> RunManifest:
    """``manifest`` of an evaluation that completed under ``grading`` with ``verdicts`` (its current ones): each
    record gains the grader versions and checks hashes of the verdicts made by its grading (kept from before too:
    a verdict a later grading replaced was still made by it), ``comparable_key`` becomes ``graded_key`` of the key
    as submitted, and the record of ``grading`` keeps that key. Raises nothing."""
    base = manifest.base_key or manifest.comparable_key
    key = graded_key(base, verdicts)
    records = []
    for record in manifest.gradings:
        own = [v for v in verdicts if v.grading == record.grading]
        update: dict[str, object] = {
            "grader_versions": _union(record.grader_versions, (v.grader_version for v in own)),
            "checks_hashes": _union(record.checks_hashes, (v.checks_hash for v in own)),
        }
        if record.grading == grading:
            update["comparable_key"] = key
        records.append(record.model_copy(update=update))
    return manifest.model_copy(update={"base_key": base, "comparable_key": key, "gradings": records})


def _union(kept: list[str], found: Iterable[str | None]) -> list[str]:
    return sorted(set(kept) | {value for value in found if value is not None})
