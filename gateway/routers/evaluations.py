"""Evaluations: submit one, follow its progress, read its verdicts, metrics and trajectories."""

import uuid

from fastapi import APIRouter, status
from pydantic import BaseModel

from gateway.deps import RedisDep, SettingsDep, StateDep, StoreDep, SuiteDep
from gateway.problems import Problem
from services.evaluation import Evaluation, EvaluationCreate, EvaluationView, TaskState
from services.metrics import build_results
from services.queues import (
    DEFAULT_SESSION_JOB_TIMEOUT_S,
    RUN_SESSION_JOB,
    SESSIONS_QUEUE,
    SessionJob,
    enqueue,
    session_job_id,
)
from services.suite import Suite
from services.trajectory import Trajectory
from services.verdict import Results, Verdict, VerdictStatus

router = APIRouter(prefix="/v1/evaluations", tags=["evaluations"])


class TaskStatus(BaseModel):
    """One task of an evaluation: where it stands, and its verdict once graded."""

    index: int
    state: TaskState
    verdict: Verdict | None = None


def _selected_tasks(body: EvaluationCreate, suite: Suite) -> list[int]:
    """The task indices the body asks for, all of the suite's when it names none.

    Raises:
        Problem: 422 for indices the suite does not have.
    """
    if body.tasks is None:
        return sorted(suite.tasks)
    unknown = [index for index in body.tasks if index not in suite.tasks]
    if unknown:
        raise Problem(
            422,
            "Unknown tasks",
            f"suite {suite.name!r} has no task {', '.join(map(str, unknown))}; "
            f"list its tasks with GET /v1/suites/{suite.name}/tasks",
        )
    return list(body.tasks)


def _unavailable_verdict(evaluation_id: str, suite: Suite, index: int) -> Verdict:
    task = suite.task(index)
    return Verdict(
        evaluation_id=evaluation_id,
        task_index=index,
        attempt=0,
        paper_category=task.paper_category,
        status=VerdictStatus.UNAVAILABLE,
        reason="input files missing from this copy of the suite: " + ", ".join(task.missing_inputs),
    )


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    operation_id="create_evaluation",
    summary="Submit a model endpoint for evaluation on a suite",
)
def create_evaluation(
    body: EvaluationCreate, settings: SettingsDep, suite: SuiteDep, state: StateDep, store: StoreDep, redis: RedisDep
) -> EvaluationView:
    """Store the evaluation durably, then enqueue one session per available task.

    Tasks whose input files are missing from the suite are reported ``unavailable`` and not run.
    """
    if body.suite != suite.name:
        raise Problem(422, "Unknown suite", f"no suite {body.suite!r}; this service offers {suite.name!r}")
    if body.prompt not in suite.prompts():
        raise Problem(
            422,
            "Unknown prompt",
            f"suite {suite.name!r} has no prompt {body.prompt!r}; use one of: " + ", ".join(suite.prompts()),
        )
    indices = _selected_tasks(body, suite)
    evaluation = Evaluation(
        id=uuid.uuid4().hex[:20],
        model=body.model,
        has_api_key=body.api_key is not None,
        suite=suite.name,
        tasks=indices,
        unavailable_tasks=[i for i in indices if not suite.task(i).available],
        max_turns=body.max_turns,
        cell_timeout_s=body.cell_timeout_s,
        prompt=body.prompt,
        sampling=body.sampling,
        judge=body.judge,
        has_judge_api_key=body.judge_api_key is not None,
    )
    store.put_evaluation(evaluation)
    unavailable = [_unavailable_verdict(evaluation.id, suite, i) for i in evaluation.unavailable_tasks]
    state.create(
        evaluation,
        body.api_key.get_secret_value() if body.api_key else None,
        unavailable,
        judge_api_key=body.judge_api_key.get_secret_value() if body.judge_api_key else None,
    )
    for index in indices:
        if index in evaluation.unavailable_tasks:
            continue
        job = SessionJob(evaluation_id=evaluation.id, task_index=index)
        enqueue(
            redis,
            SESSIONS_QUEUE,
            RUN_SESSION_JOB,
            job,
            job_id=session_job_id(job),
            timeout_s=DEFAULT_SESSION_JOB_TIMEOUT_S,
        )
    progress = state.progress(evaluation.id)
    return EvaluationView(evaluation=evaluation, status=state.status(progress), progress=progress)


@router.get("/{evaluation_id}", operation_id="get_evaluation", summary="Status and progress of an evaluation")
def get_evaluation(evaluation_id: str, state: StateDep) -> EvaluationView:
    evaluation = state.get(evaluation_id)
    progress = state.progress(evaluation_id)
    return EvaluationView(evaluation=evaluation, status=state.status(progress), progress=progress)


@router.get("/{evaluation_id}/results", operation_id="get_results", summary="Per-task verdicts and the metrics so far")
def get_results(evaluation_id: str, state: StateDep) -> Results:
    state.get(evaluation_id)
    progress = state.progress(evaluation_id)
    return build_results(evaluation_id, state.verdicts(evaluation_id), progress.finished == progress.total)


@router.get("/{evaluation_id}/tasks", operation_id="list_evaluation_tasks", summary="Every task's state")
def list_tasks(evaluation_id: str, state: StateDep) -> list[TaskStatus]:
    state.get(evaluation_id)
    verdicts = {v.task_index: v for v in state.verdicts(evaluation_id)}
    return [
        TaskStatus(index=index, state=task_state, verdict=verdicts.get(index))
        for index, task_state in sorted(state.task_states(evaluation_id).items())
    ]


@router.get(
    "/{evaluation_id}/tasks/{task_index}/trajectory",
    operation_id="get_trajectory",
    summary="The trajectory of a task's session (messages in PyBench's shapes, turns, sandbox)",
)
def get_trajectory(
    evaluation_id: str, task_index: int, state: StateDep, store: StoreDep, attempt: int = 1
) -> Trajectory:
    state.get(evaluation_id)
    return store.get_trajectory(evaluation_id, task_index, attempt)
