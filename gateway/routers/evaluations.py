"""Evaluations: submit one, follow its progress, read its verdicts, metrics and trajectories."""

import uuid
from typing import Annotated, NamedTuple

import anyio
from fastapi import APIRouter, Depends, Header, Query, Request, Response, status
from fastapi.responses import FileResponse, StreamingResponse
from pydantic import BaseModel, Field, SecretStr
from redis import Redis

from gateway import idempotency, limits, readmodel
from gateway.archive import ARCHIVE_MEDIA_TYPE, stream_archive
from gateway.auth import Caller
from gateway.deps import LifecycleDep, RedisDep, SettingsDep, StateDep, StoreDep, StreamsDep, SuiteDep
from gateway.egress import check_endpoints
from gateway.preflight import preflight
from gateway.problems import Problem
from gateway.settings import GatewaySettings
from gateway.streams import event_response
from services.endpoint.netguard import EgressPolicy
from services.errors import ArtifactNotFoundError
from services.evaluation import (
    Evaluation,
    EvaluationCreate,
    EvaluationPage,
    EvaluationStatus,
    EvaluationView,
    TaskState,
)
from services.live.apikeys import ApiKey
from services.live.components import advertised
from services.live.retention import MIB, storage_used
from services.live.secretbox import SecretsKeyMissingError
from services.pybench.suite import Suite
from services.results.epochs import epoch_concurrency, epoch_sampling
from services.results.manifest import build_manifest
from services.state import EvaluationNotFoundError, StateStore
from services.store import ArtifactStore
from services.trajectory import Trajectory
from services.verdict import Results, Verdict

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


def _check_storage_quota(redis: Redis, store: ArtifactStore, owner: str, settings: GatewaySettings) -> None:
    """Refuse a submission by a key whose evaluations' trajectories and files already take its storage quota
    (``services.live.retention.storage_used``); nothing to check when the quota is 0.

    Raises:
        Problem: 409 at or over ``PBE_STORAGE_QUOTA_MB_PER_KEY``, saying the usage, the quota and what frees space.
    """
    quota_mib = settings.STORAGE_QUOTA_MB_PER_KEY
    if quota_mib == 0:
        return
    used = storage_used(redis, store, owner)
    if used < quota_mib * MIB:
        return
    retention = (
        f"wait for retention to remove their trajectories and files {settings.RETENTION_DAYS} days after they "
        "finished (PBE_RETENTION_DAYS)"
        if settings.RETENTION_DAYS
        else "turn retention on (PBE_RETENTION_DAYS is 0: nothing is removed by itself)"
    )
    raise Problem(
        409,
        "Storage quota reached",
        f"this key's evaluations take {used / MIB:.1f} MiB of trajectories and files in the artifact store, at or "
        f"over its quota of {quota_mib} MiB (PBE_STORAGE_QUOTA_MB_PER_KEY); to submit again, free space: have the "
        f"operator delete old evaluations, or {retention}; an operator may also raise the quota",
        usage_bytes=used,
        quota_bytes=quota_mib * MIB,
        setting="PBE_STORAGE_QUOTA_MB_PER_KEY",
    )


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    operation_id="create_evaluation",
    summary="Submit a model endpoint for evaluation on a suite",
    responses={200: {"description": "A repeated submission with the same Idempotency-Key: the same evaluation"}},
)
def create_evaluation(
    body: EvaluationCreate,
    caller: Caller,
    settings: SettingsDep,
    suite: SuiteDep,
    state: StateDep,
    lifecycle: LifecycleDep,
    store: StoreDep,
    redis: RedisDep,
    response: Response,
    request: Request,
    idempotency_key: Annotated[str | None, Header(min_length=1, max_length=200)] = None,
) -> EvaluationView:
    """Store the evaluation durably, then enqueue one session per available task.

    Tasks whose input files are missing from the suite are reported ``unavailable`` and not run. With an
    ``Idempotency-Key`` header, a repeated submission returns the evaluation the first one made. Unless
    ``preflight`` is false, the model endpoint must first answer, serve the model and reply to a canary prompt
    with code in the prompt's format. A key whose stored artifacts reach its storage quota gets 409. With
    ``epochs`` above 1, one evaluation per epoch is made (the answer is the first's, whose id names the run; the
    others are listed at ``GET /v1/evaluations/{id}/epochs``).
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
    if (body.api_key or body.judge_api_key) and settings.secret_box() is None:
        raise SecretsKeyMissingError(
            "this service cannot keep API keys (PBE_SECRETS_KEY is not set; make env writes one into .env): "
            "submit without api_key and judge_api_key, or ask the operator to set it"
        )
    check_endpoints(body, settings, request.app.state.egress_resolver)
    claim = idempotency.claim(redis, caller.id, idempotency_key, body, settings.IDEMPOTENCY_TTL_S)
    if claim.existing is not None:
        response.status_code = status.HTTP_200_OK
        return readmodel.view(state, state.get(claim.existing))
    try:
        _check_storage_quota(redis, store, caller.id, settings)
        if body.preflight and settings.PREFLIGHT:
            preflight(
                body, suite, EgressPolicy.parse(settings.EGRESS_ALLOWLIST), resolver=request.app.state.egress_resolver
            )
        runnable = [i for i in indices if suite.task(i).available]
        limits.check_capacity(redis, state, caller.id, len(runnable) * body.epochs, settings)
        manifest = build_manifest(body, suite, indices, advertised(redis))
        run_id = claim.evaluation_id if body.epochs > 1 else None
        ids = [claim.evaluation_id, *(uuid.uuid4().hex[:20] for _ in range(body.epochs - 1))]
        epochs = [
            Evaluation(
                id=evaluation_id,
                owner=caller.id,
                model=body.model,
                has_api_key=body.api_key is not None,
                suite=suite.name,
                tasks=indices,
                unavailable_tasks=[i for i in indices if not suite.task(i).available],
                max_turns=body.max_turns,
                cell_timeout_s=body.cell_timeout_s,
                prompt=body.prompt,
                mode=body.mode,
                sampling=epoch_sampling(body.sampling, claim.evaluation_id, epoch, body.epochs),
                judge=body.judge,
                has_judge_api_key=body.judge_api_key is not None,
                max_concurrency=epoch_concurrency(body.max_concurrency, body.epochs),
                prices=body.prices,
                budgets=body.budgets,
                reply_cache=body.reply_cache,
                manifest=manifest,
                run_id=run_id,
                epoch=epoch,
                epochs=body.epochs,
            )
            for epoch, evaluation_id in enumerate(ids, start=1)
        ]
        for evaluation in epochs:
            store.put_evaluation(evaluation)
            lifecycle.create(
                evaluation,
                suite,
                api_key=body.api_key.get_secret_value() if body.api_key else None,
                judge_api_key=body.judge_api_key.get_secret_value() if body.judge_api_key else None,
            )
    except BaseException:
        idempotency.release(redis, claim)
        raise
    idempotency.confirm(redis, claim, settings.IDEMPOTENCY_TTL_S)
    for evaluation in epochs:
        lifecycle.queue_sessions(evaluation)
    return readmodel.view(state, epochs[0])


def owned(state: StateStore, caller: ApiKey, evaluation_id: str) -> Evaluation:
    """The evaluation, if the caller may see it.

    Raises:
        EvaluationNotFoundError: there is none, or it belongs to another key (the two are not told apart).
    """
    evaluation = state.get(evaluation_id)
    if not caller.admin and evaluation.owner != caller.id:
        raise EvaluationNotFoundError(f"no evaluation {evaluation_id!r}; list yours with GET /v1/evaluations")
    return evaluation


@router.get("", operation_id="list_evaluations", summary="Your evaluations, newest first, a page at a time")
def list_evaluations(
    caller: Caller,
    state: StateDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: Annotated[str | None, Query(pattern=r"^[0-9]+(\.[0-9]+)?$", description="next_cursor of a page")] = None,
    model: Annotated[str | None, Query(max_length=256, description="only this model name")] = None,
    status_filter: Annotated[EvaluationStatus | None, Query(alias="status")] = None,
) -> EvaluationPage:
    items: list[EvaluationView] = []
    before = float(cursor) if cursor is not None else None
    owner = None if caller.admin else caller.id
    while len(items) < limit:
        batch = state.evaluation_ids(owner, limit=limit * 2, before=before)
        if not batch:
            return EvaluationPage(items=items)
        for evaluation_id, score in batch:
            before = score
            view = readmodel.view(state, state.get(evaluation_id))
            if (model is None or view.evaluation.model.model == model) and (
                status_filter is None or view.status is status_filter
            ):
                items.append(view)
                if len(items) == limit:
                    break
    return EvaluationPage(items=items, next_cursor=repr(before) if before is not None else None)


@router.get("/{evaluation_id}", operation_id="get_evaluation", summary="Status and progress of an evaluation")
def get_evaluation(evaluation_id: str, caller: Caller, state: StateDep) -> EvaluationView:
    return readmodel.view(state, owned(state, caller, evaluation_id))


@router.post("/{evaluation_id}/cancel", operation_id="cancel_evaluation", summary="Cancel an evaluation")
def cancel_evaluation(evaluation_id: str, caller: Caller, state: StateDep, lifecycle: LifecycleDep) -> EvaluationView:
    """Queued tasks are cancelled (their jobs removed); a running session stops before its next turn (its
    trajectory so far is kept, ungraded); sessions that already finished are graded."""
    evaluation = owned(state, caller, evaluation_id)
    lifecycle.cancel(evaluation.id)
    return readmodel.view(state, evaluation)


class RetryRequest(BaseModel):
    model_config = {"extra": "forbid"}

    tasks: list[int] | None = Field(default=None, description="Tasks to run again; all failed ones when omitted.")
    api_key: SecretStr | None = Field(
        default=None, description="The model endpoint's key, as submitted: a finished evaluation no longer holds it."
    )
    judge_api_key: SecretStr | None = Field(default=None, description="The judge endpoint's key, likewise.")


@router.post(
    "/{evaluation_id}/retry",
    operation_id="retry_evaluation_tasks",
    summary="Run failed tasks again (failed, infra_error or ungradable ones), as new attempts",
)
def retry_tasks(
    evaluation_id: str, caller: Caller, state: StateDep, lifecycle: LifecycleDep, body: RetryRequest | None = None
) -> EvaluationView:
    evaluation = owned(state, caller, evaluation_id)
    if state.cancelled(evaluation.id):
        raise Problem(409, "Evaluation cancelled", "a cancelled evaluation is not run again; submit a new one")
    verdicts = {v.task_index: v for v in state.verdicts(evaluation.id)}
    failed = sorted(i for i, v in verdicts.items() if v.status in readmodel.RETRYABLE)
    wanted = failed if body is None or body.tasks is None else body.tasks
    refused = sorted(set(wanted) - set(failed))
    if refused:
        raise Problem(
            409,
            "Tasks not retryable",
            f"tasks {refused} have no failed verdict (yet); retry only tasks in: {failed or 'none'}",
        )
    keys = KeysUpdate(api_key=body.api_key, judge_api_key=body.judge_api_key) if body else KeysUpdate()
    _check_keys(evaluation, keys)
    if evaluation.has_api_key and keys.api_key is None and state.model_key(evaluation.id) is None:
        raise Problem(
            409,
            "Model key needed",
            "this evaluation's model API key is no longer held (keys are dropped once an evaluation finishes): "
            "send it with the retry as api_key (the CLI: retry --model-key-env VAR)",
        )
    if keys.api_key is not None or keys.judge_api_key is not None:
        _hold_keys(state, evaluation.id, keys)
    for index in wanted:
        lifecycle.retry(evaluation.id, index)
    return readmodel.view(state, evaluation)


class KeysUpdate(BaseModel):
    model_config = {"extra": "forbid"}

    api_key: SecretStr | None = Field(default=None, description="The model endpoint's key, as submitted.")
    judge_api_key: SecretStr | None = Field(default=None, description="The judge endpoint's key, as submitted.")


@router.put(
    "/{evaluation_id}/keys",
    operation_id="put_evaluation_keys",
    summary="Send an evaluation's API keys again (after the service lost them, or they expired)",
)
def put_keys(evaluation_id: str, body: KeysUpdate, caller: Caller, state: StateDep) -> EvaluationView:
    """Keys live in Redis only, for 14 days: a Redis restart without persistence, or a long evaluation, loses
    them, and sessions then stop with a model error that points here instead of calling the endpoint without
    its key. Only keys the evaluation was submitted with are taken; they are never returned."""
    evaluation = owned(state, caller, evaluation_id)
    if body.api_key is None and body.judge_api_key is None:
        raise Problem(422, "No key", "send api_key, judge_api_key or both")
    _check_keys(evaluation, body)
    if state.complete(evaluation.id):
        raise Problem(
            409,
            "Evaluation finished",
            "a finished evaluation's keys are not stored again: send them with POST .../retry (the CLI: retry "
            "--model-key-env VAR) to run failed tasks again",
        )
    _hold_keys(state, evaluation.id, body)
    return readmodel.view(state, evaluation)


def _check_keys(evaluation: Evaluation, keys: KeysUpdate) -> None:
    """Raises: Problem: 409 for a key the evaluation was not submitted with."""
    if keys.api_key is not None and not evaluation.has_api_key:
        raise Problem(409, "No model key", "this evaluation was submitted without a model API key; submit a new one")
    if keys.judge_api_key is not None and not evaluation.has_judge_api_key:
        raise Problem(409, "No judge key", "this evaluation was submitted without a judge API key; submit a new one")


def _hold_keys(state: StateStore, evaluation_id: str, keys: KeysUpdate) -> None:
    state.set_keys(
        evaluation_id,
        keys.api_key.get_secret_value() if keys.api_key else None,
        keys.judge_api_key.get_secret_value() if keys.judge_api_key else None,
    )


@router.get("/{evaluation_id}/results", operation_id="get_results", summary="Per-task verdicts and the metrics so far")
def get_results(evaluation_id: str, caller: Caller, state: StateDep) -> Results:
    return readmodel.results(state, owned(state, caller, evaluation_id))


@router.get("/{evaluation_id}/tasks", operation_id="list_evaluation_tasks", summary="Every task's state")
def list_tasks(evaluation_id: str, caller: Caller, state: StateDep) -> list[TaskStatus]:
    owned(state, caller, evaluation_id)
    verdicts = {v.task_index: v for v in state.verdicts(evaluation_id)}
    return [
        TaskStatus(index=index, state=task_state, verdict=verdicts.get(index))
        for index, task_state in sorted(state.task_states(evaluation_id).items())
    ]


class TaskAttempt(NamedTuple):
    """One attempt of a task, as a request names it."""

    evaluation_id: str
    task_index: int
    attempt: int


def chosen_task_attempt(
    evaluation_id: str,
    task_index: int,
    caller: Caller,
    state: StateDep,
    attempt: Annotated[int | None, Query(ge=1, le=100, description="the task's latest attempt when omitted")] = None,
) -> TaskAttempt:
    """The attempt a request names (the task's latest when it names none), of an evaluation the caller may see.

    Raises:
        EvaluationNotFoundError: the caller may see no such evaluation.
        TaskNotFoundError: the evaluation has no such task.
    """
    evaluation = owned(state, caller, evaluation_id)
    return TaskAttempt(evaluation.id, task_index, readmodel.chosen_attempt(state, evaluation, task_index, attempt))


TaskAttemptDep = Annotated[TaskAttempt, Depends(chosen_task_attempt)]


@router.get(
    "/{evaluation_id}/tasks/{task_index}/trajectory",
    operation_id="get_trajectory",
    summary="The trajectory of a task's session (messages in PyBench's shapes, turns, sandbox)",
)
def get_trajectory(chosen: TaskAttemptDep, store: StoreDep) -> Trajectory:
    return store.get_trajectory(*chosen)


@router.get(
    "/{evaluation_id}/tasks/{task_index}/files",
    operation_id="list_task_files",
    summary="The files a task's session saved under ./output",
)
def list_task_files(chosen: TaskAttemptDep, store: StoreDep) -> list[str]:
    return store.list_output_files(*chosen)


@router.get(
    "/{evaluation_id}/tasks/{task_index}/files/{name:path}",
    operation_id="download_task_file",
    summary="Download one file a task's session saved (name as listed, without ./output/)",
    response_class=FileResponse,
)
def download_task_file(name: str, chosen: TaskAttemptDep, store: StoreDep) -> FileResponse:
    path = readmodel.output_file(store, *chosen, name)  # 410 when retention removed it
    if path is None:
        raise ArtifactNotFoundError(
            f"task {chosen.task_index} saved no file {name!r}; list them with GET .../tasks/{chosen.task_index}/files"
        )
    return FileResponse(path, media_type="application/octet-stream", filename=path.name)


@router.get(
    "/{evaluation_id}/archive",
    operation_id="download_archive",
    summary="The whole evaluation as one .tar.gz: evaluation, results, each task's latest trajectory and files",
    response_class=StreamingResponse,
    responses={200: {"content": {ARCHIVE_MEDIA_TYPE: {}}}},
)
def download_archive(evaluation_id: str, caller: Caller, state: StateDep, store: StoreDep) -> StreamingResponse:
    evaluation = owned(state, caller, evaluation_id)
    attempts = readmodel.latest_attempts(state, evaluation)
    store.check_kept(evaluation.id, attempts)  # 410 before streaming: an archive without the removed files would lie
    return StreamingResponse(
        stream_archive(store, evaluation, readmodel.results(state, evaluation), attempts),
        media_type=ARCHIVE_MEDIA_TYPE,
        headers={"Content-Disposition": f'attachment; filename="{evaluation.id}.tar.gz"'},
    )


@router.get(
    "/{evaluation_id}/events",
    operation_id="stream_evaluation_events",
    summary="Live progress as server-sent events: `progress` on each change, `verdict` per graded task, `end`",
    response_class=StreamingResponse,
)
async def stream_events(evaluation_id: str, caller: Caller, state: StateDep, streams: StreamsDep) -> StreamingResponse:
    evaluation = await anyio.to_thread.run_sync(owned, state, caller, evaluation_id)
    return event_response(streams, caller.id, state, [evaluation.id], verdicts=True)
