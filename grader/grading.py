"""Grading one session under both gradings (``original`` and ``fixed``, see ``grader.variants``) into a verdict.

The answer the ``original`` grading reads is the content of the trajectory's last message whatever its role,
as PyBench's own tests read it (a session that hits the turn limit ends on a code-interpreter message); the
``fixed`` grading reads the final assistant message. Checks on the answer and on file names run here; checks
that open produced files run through ``run_file_checks`` (a grading sandbox), once for both gradings. A
session that the environment broke gets ``infra_error`` under both, never ``failed``.

The ``original`` grading may also see files other tasks of the evaluation produced, as the benchmark's shared
``./output`` would show them (an ``OriginalView``, built by ``grader.shared_output``); the ``fixed`` grading sees
the session's own files only. When there are such files, the two gradings' file-opening checks run in two
grading sandboxes, each with its own view.

What a verdict was graded with is recorded in it: the grader build (``services.results.manifest.service_version``) and
``checks_hash``, a sha256 over ``CHECKS_VERSION`` and what each grading applies to every task of the suite.
"""

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from grader.checks import CheckContext, normalise_output_path, run_check, runs_in_process
from grader.shared_output import named_outputs
from grader.variants import Forced, Grading, checks_for, forced_outcome, ungradable_reason
from services.pybench.suite import Suite
from services.task import Task
from services.trajectory import Trajectory
from services.verdict import CheckResult, GradingOutcome, Verdict, VerdictStatus, session_verdict

FileCheckRunner = Callable[[list[dict[str, Any]]], list[CheckResult]]
"""Runs checks that open the session's files, returning one result per check in order (never raises)."""

CHECKS_VERSION = 1
"""The version of the check code: what a check kind does (``grader.checks``, ``grader.file_checks``), how the two
gradings depart from the checks as written (``grader.variants``), what they read and see (this module,
``grader.shared_output``). Bump it with any change that can turn a verdict; ``checks_hash`` covers it, and runs
graded under another version than ``services.results.manifest.BASELINE_CHECKS_VERSION`` get their own comparable key."""


def applied_checks(task: Task, grading: Grading) -> dict[str, Any]:
    """What ``grading`` applies to ``task``, as data: the outcome it always gives (``forced``), that it cannot grade
    the task here (``ungradable``), or the checks it runs (``checks``, empty: none, so ``ungradable`` too)."""
    forced = forced_outcome(task.index, grading)
    if forced is not None:
        return {"forced": forced.value}
    if ungradable_reason(task.index, grading):
        return {"ungradable": True}
    return {"checks": checks_for(task.index, task.checks, grading)}


def checks_hash(suite: Suite) -> str:
    """sha256 (hex) of ``CHECKS_VERSION`` and, for every task of ``suite`` by index, what each grading applies to
    it (``applied_checks``): verdicts with one hash were graded by the same checks, read the same way. The reasons'
    wording and the task's notes are left out; the files the checks compare against are in the suite's content
    hash. Raises nothing."""
    tasks = {
        str(index): {grading.value: applied_checks(suite.tasks[index], grading) for grading in Grading}
        for index in sorted(suite.tasks)
    }
    text = json.dumps({"version": CHECKS_VERSION, "tasks": tasks}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class OriginalView:
    """What the ``original`` grading sees beyond the session's own files.

    ``borrowed``: the ``./output/...`` names of other tasks' files it sees (``grader.shared_output.Borrowed``),
    each with where it comes from (``task 67, attempt 1``), which the details of the checks that read it say.
    ``run_file_checks``: runs file-opening checks over the session's files with those added (None: such checks
    are undecided, as without a grading sandbox).
    """

    borrowed: Mapping[str, str] = field(default_factory=dict)
    run_file_checks: FileCheckRunner | None = None


OWN_FILES = OriginalView()
"""The view of a session's own files only: what the ``fixed`` grading always sees."""


def final_assistant_answer(trajectory: Trajectory) -> str:
    """The content of the last assistant message (empty when the model never answered)."""
    for message in reversed(trajectory.messages):
        if message.role == "assistant":
            return message.content
    return ""


def _key(check: dict[str, Any]) -> str:
    return json.dumps(check, sort_keys=True)


SandboxedResults = Callable[[Grading, dict[str, Any]], CheckResult]
"""The result of a grading's file-opening check, looked up after they all ran."""


def _sandboxed_results(
    task: Task, gradings: tuple[Grading, ...], run_file_checks: FileCheckRunner | None, view: OriginalView
) -> SandboxedResults:
    """Run the file-opening checks of ``gradings``: in one go when both see the same files, else one run per
    view (the original grading's with the borrowed files); return a lookup of their results."""
    runs: list[tuple[tuple[Grading, ...], FileCheckRunner | None]]
    if view.borrowed:
        runs = [((g,), view.run_file_checks if g is Grading.ORIGINAL else run_file_checks) for g in gradings]
    else:
        runs = [(gradings, run_file_checks)]
    results: dict[tuple[Grading, str], CheckResult] = {}
    for together, runner in runs:
        wanted: dict[str, dict[str, Any]] = {}
        for grading in together:
            if forced_outcome(task.index, grading) is None and not ungradable_reason(task.index, grading):
                for check in checks_for(task.index, task.checks, grading):
                    if not runs_in_process(check):
                        wanted.setdefault(_key(check), check)
        if wanted and runner is not None:
            checks = list(wanted.values())
            for check, outcome in zip(checks, runner(checks), strict=True):
                results.update({(grading, _key(check)): outcome for grading in together})

    def lookup(grading: Grading, check: dict[str, Any]) -> CheckResult:
        kind = str(check.get("kind", ""))
        return results.get((grading, _key(check))) or CheckResult(
            kind=kind, passed=None, detail=f"{kind} opens produced files and needs a grading sandbox; none was given"
        )

    return lookup


def _outcome(checks: list[CheckResult]) -> GradingOutcome:
    outcomes = [result.passed for result in checks]
    if False in outcomes:
        return GradingOutcome(
            status=VerdictStatus.FAILED, checks=checks, reason="; ".join(r.detail for r in checks if r.passed is False)
        )
    if None in outcomes:
        return GradingOutcome(
            status=VerdictStatus.UNGRADABLE,
            checks=checks,
            reason="; ".join(r.detail for r in checks if r.passed is None),
        )
    return GradingOutcome(status=VerdictStatus.PASSED, checks=checks)


def _grade_one(
    task: Task,
    grading: Grading,
    context: CheckContext,
    sandboxed: SandboxedResults,
) -> GradingOutcome:
    forced = forced_outcome(task.index, grading)
    if forced is not None:
        status = VerdictStatus.PASSED if forced is Forced.ALWAYS_PASSES else VerdictStatus.FAILED
        return GradingOutcome(status=status, reason=f"the benchmark's test for task {task.index} {forced.value}")
    reason = ungradable_reason(task.index, grading)
    if reason:
        return GradingOutcome(status=VerdictStatus.UNGRADABLE, reason=reason)
    checks = checks_for(task.index, task.checks, grading)
    if not checks:
        return GradingOutcome(status=VerdictStatus.UNGRADABLE, reason=f"task {task.index} has no checks in the suite")
    return _outcome([run_check(c, context) if runs_in_process(c) else sandboxed(grading, c) for c in checks])


def grade(
    task: Task,
    trajectory: Trajectory,
    output_files: list[str],
    run_file_checks: FileCheckRunner | None = None,
    original_view: OriginalView = OWN_FILES,
) -> Verdict:
    """Return the verdict of one session of ``task`` under both gradings.

    ``output_files``: the produced files' names (``./output/...``). ``run_file_checks``: runs the checks that
    open files (in a grading sandbox); without it those checks are undecided and the grading ``ungradable``.
    ``original_view``: other tasks' files the original grading sees too (``grader.shared_output``).
    """
    verdict = session_verdict(trajectory, task.paper_category)
    if trajectory.end_reason.infra:
        return verdict
    files = frozenset(normalise_output_path(name) for name in output_files)
    sandboxed = _sandboxed_results(task, (Grading.ORIGINAL, Grading.FIXED), run_file_checks, original_view)
    original = _grade_original(task, trajectory, files, original_view, sandboxed)
    verdict.fixed = _grade_one(task, Grading.FIXED, CheckContext(final_assistant_answer(trajectory), files), sandboxed)
    verdict.status, verdict.checks, verdict.reason = original.status, original.checks, original.reason
    return verdict


def _grade_original(
    task: Task, trajectory: Trajectory, files: frozenset[str], view: OriginalView, sandboxed: SandboxedResults
) -> GradingOutcome:
    context = CheckContext(trajectory.last_message, files | frozenset(view.borrowed))
    outcome = _grade_one(task, Grading.ORIGINAL, context, sandboxed)
    checks = checks_for(task.index, task.checks, Grading.ORIGINAL)
    if not view.borrowed or not outcome.checks or len(outcome.checks) != len(checks):
        return outcome  # nothing borrowed, or a forced or undecidable outcome
    results = []
    for check, result in zip(checks, outcome.checks, strict=True):
        paths = named_outputs(check)
        seen = [
            f"{name} of {source}"
            for name, source in sorted(view.borrowed.items())
            if any(name.rstrip("/") == path or name.startswith(path + "/") for path in paths)
        ]
        note = f" (in the shared ./output: {', '.join(seen)})" if seen else ""
        results.append(result.model_copy(update={"detail": result.detail + note}))
    return _outcome(results)


def regrade_original(
    verdict: Verdict, task: Task, trajectory: Trajectory, output_files: list[str], view: OriginalView
) -> Verdict:
    """``verdict`` with its ``original`` grading done again over ``view`` (the fixed grading and the judgment are
    kept: neither sees other tasks' files). A verdict of a session the environment broke is returned as it is.

    Raises whatever ``view.run_file_checks`` raises (``SandboxStartError`` for a grading sandbox).
    """
    if verdict.status is VerdictStatus.INFRA_ERROR:
        return verdict
    files = frozenset(normalise_output_path(name) for name in output_files)
    sandboxed = _sandboxed_results(task, (Grading.ORIGINAL,), view.run_file_checks, view)
    original = _grade_original(task, trajectory, files, view, sandboxed)
    return verdict.model_copy(update={"status": original.status, "checks": original.checks, "reason": original.reason})
