"""Grading one session: the task's checks against the final answer and the produced files, into a verdict.

The answer is the content of the trajectory's last message whatever its role, as PyBench's own tests read
it (a session that hits the turn limit ends on a code-interpreter message). A session that the environment
broke gets ``infra_error``, never ``failed``.
"""

from grader.checks import CheckContext, normalise_output_path, run_check
from services.task import Task
from services.trajectory import Trajectory
from services.verdict import Verdict, VerdictStatus


def grade(task: Task, trajectory: Trajectory, output_files: list[str]) -> Verdict:
    """Return the verdict of one session of ``task``."""
    verdict = Verdict(
        evaluation_id=trajectory.evaluation_id,
        task_index=task.index,
        attempt=trajectory.attempt,
        paper_category=task.paper_category,
        status=VerdictStatus.FAILED,
        turns=trajectory.assistant_turns,
        sandbox_id=trajectory.session.sandbox_id if trajectory.session else None,
    )
    if trajectory.end_reason.infra:
        verdict.status = VerdictStatus.INFRA_ERROR
        verdict.reason = f"{trajectory.end_reason.value}: {trajectory.error or 'no detail'}"
        return verdict
    if not task.checks:
        verdict.status = VerdictStatus.UNGRADABLE
        verdict.reason = f"task {task.index} has no checks in the suite"
        return verdict
    context = CheckContext(
        answer=trajectory.last_message,
        output_files=frozenset(normalise_output_path(name) for name in output_files),
    )
    verdict.checks = [run_check(check, context) for check in task.checks]
    outcomes = [result.passed for result in verdict.checks]
    if False in outcomes:
        verdict.status = VerdictStatus.FAILED
        verdict.reason = "; ".join(r.detail for r in verdict.checks if r.passed is False)
    elif None in outcomes:
        verdict.status = VerdictStatus.UNGRADABLE
        verdict.reason = "; ".join(r.detail for r in verdict.checks if r.passed is None)
    else:
        verdict.status = VerdictStatus.PASSED
    return verdict
