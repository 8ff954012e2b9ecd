"""Grading one session under both gradings (``original`` and ``fixed``, see ``grader.variants``) into a verdict.

The answer the ``original`` grading reads is the content of the trajectory's last message whatever its role,
as PyBench's own tests read it (a session that hits the turn limit ends on a code-interpreter message); the
``fixed`` grading reads the final assistant message. Checks on the answer and on file names run here; checks
that open produced files run through ``run_file_checks`` (a grading sandbox), once for both gradings. A
session that the environment broke gets ``infra_error`` under both, never ``failed``.
"""

import json
from collections.abc import Callable
from typing import Any

from grader.checks import CheckContext, normalise_output_path, run_check, runs_in_process
from grader.variants import Forced, Grading, checks_for, forced_outcome, ungradable_reason
from services.task import Task
from services.trajectory import Trajectory
from services.verdict import CheckResult, GradingOutcome, Verdict, VerdictStatus

FileCheckRunner = Callable[[list[dict[str, Any]]], list[CheckResult]]
"""Runs checks that open the session's files, returning one result per check in order (never raises)."""


def final_assistant_answer(trajectory: Trajectory) -> str:
    """The content of the last assistant message (empty when the model never answered)."""
    for message in reversed(trajectory.messages):
        if message.role == "assistant":
            return message.content
    return ""


def _key(check: dict[str, Any]) -> str:
    return json.dumps(check, sort_keys=True)


def _sandboxed_results(task: Task, run_file_checks: FileCheckRunner | None) -> Callable[[dict[str, Any]], CheckResult]:
    """Run every file-opening check of both gradings in one go; return a lookup of their results."""
    wanted: dict[str, dict[str, Any]] = {}
    for grading in Grading:
        if forced_outcome(task.index, grading) is None and not ungradable_reason(task.index, grading):
            for check in checks_for(task.index, task.checks, grading):
                if not runs_in_process(check):
                    wanted.setdefault(_key(check), check)
    results: dict[str, CheckResult] = {}
    if wanted and run_file_checks is not None:
        checks = list(wanted.values())
        outcomes = run_file_checks(checks)
        results = {_key(check): outcome for check, outcome in zip(checks, outcomes, strict=True)}

    def lookup(check: dict[str, Any]) -> CheckResult:
        kind = str(check.get("kind", ""))
        return results.get(_key(check)) or CheckResult(
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
    sandboxed: Callable[[dict[str, Any]], CheckResult],
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
    return _outcome([run_check(c, context) if runs_in_process(c) else sandboxed(c) for c in checks])


def grade(
    task: Task,
    trajectory: Trajectory,
    output_files: list[str],
    run_file_checks: FileCheckRunner | None = None,
) -> Verdict:
    """Return the verdict of one session of ``task`` under both gradings.

    ``output_files``: the produced files' names (``./output/...``). ``run_file_checks``: runs the checks that
    open files (in a grading sandbox); without it those checks are undecided and the grading ``ungradable``.
    """
    verdict = Verdict(
        evaluation_id=trajectory.evaluation_id,
        task_index=task.index,
        attempt=trajectory.attempt,
        paper_category=task.paper_category,
        status=VerdictStatus.FAILED,
        turns=trajectory.assistant_turns,
        prompt_tokens=trajectory.prompt_tokens,
        completion_tokens=trajectory.completion_tokens,
        sandbox_id=trajectory.session.sandbox_id if trajectory.session else None,
    )
    if trajectory.end_reason.infra:
        reason = f"{trajectory.end_reason.value}: {trajectory.error or 'no detail'}"
        verdict.status, verdict.reason = VerdictStatus.INFRA_ERROR, reason
        verdict.retryable = trajectory.end_reason.retryable
        verdict.fixed = GradingOutcome(status=VerdictStatus.INFRA_ERROR, reason=reason)
        return verdict
    files = frozenset(normalise_output_path(name) for name in output_files)
    sandboxed = _sandboxed_results(task, run_file_checks)
    original = _grade_one(task, Grading.ORIGINAL, CheckContext(trajectory.last_message, files), sandboxed)
    verdict.fixed = _grade_one(task, Grading.FIXED, CheckContext(final_assistant_answer(trajectory), files), sandboxed)
    verdict.status, verdict.checks, verdict.reason = original.status, original.checks, original.reason
    return verdict
