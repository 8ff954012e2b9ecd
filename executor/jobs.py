"""The executor's RQ job: run one task session, store its trajectory and files, enqueue its grading.

Workers run ``rq worker --worker-class executor.worker.ExecutorWorker --serializer
rq.serializers.JSONSerializer pbe-sessions`` (jobs in-process, beside the warm pool); the gateway enqueues
``executor.jobs.run_session`` by name with a ``SessionJob`` payload (ids only, never an API key: the key is
read here from the secret store).
"""

import logging
from typing import Any

from redis import Redis

from executor.calls import SessionModel
from executor.pool import SESSION_POOL, WarmPool
from executor.session import SessionResult, key_lost, run_task_session
from executor.settings import ExecutorSettings
from services.endpoint.client import EndpointClient
from services.endpoint.netguard import EgressPolicy, pinned_transport
from services.evaluation import Evaluation
from services.lifecycle import TaskLifecycle
from services.live.replies import ReplyCache
from services.live.spend import SpendLedger
from services.observability.logs import log_context
from services.observability.monitoring import record_session
from services.pybench.suite import Suite, load_suite
from services.queues import SessionJob
from services.sandbox.base import SandboxBackend
from services.sandbox.registry import get_backend
from services.state import StateStore
from services.store import ArtifactStore
from services.task import Task
from services.trajectory import EndReason
from services.verdict import session_verdict

log = logging.getLogger(__name__)


def execute_session(
    job: SessionJob, *, settings: ExecutorSettings, redis: Redis, backend: SandboxBackend, pool: WarmPool | None = None
) -> dict[str, Any]:
    """Run the session of ``job`` and hand it to the grader.

    Returns:
        A summary: task, end reason, turns, sandbox id.

    Raises:
        EvaluationNotFoundError: the evaluation is not in Redis.
        ConfigurationError: the suite path is wrong.
        StoreError: the artifact store cannot be written.
    """
    lifecycle = TaskLifecycle(redis, settings.secret_box())
    state = lifecycle.state
    evaluation = state.get(job.evaluation_id)
    suite = load_suite(settings.require_suite())
    task = suite.task(job.task_index)
    store = ArtifactStore(settings.ARTIFACT_ROOT)
    if not lifecycle.start(job):
        log.info("task %d of %s: skipped, the evaluation was cancelled", job.task_index, evaluation.id)
        return {"task": job.task_index, "cancelled": True}
    api_key = state.model_key(evaluation.id)
    if evaluation.has_api_key and api_key is None:
        # Never call the endpoint without the key it was submitted with (nor start a sandbox for nothing).
        result: SessionResult = (key_lost(evaluation, task, job.attempt, suite), {})
        log.warning("task %d of %s: not run, the model key is no longer held", task.index, evaluation.id)
    else:
        result = _run(evaluation, task, job, suite, settings, backend, pool, api_key, state, redis)
    trajectory, files = result
    for name, data in files.items():
        store.put_output_file(evaluation.id, task.index, job.attempt, name, data)
    store.put_trajectory(trajectory)
    record_session(trajectory)
    cancelled = trajectory.end_reason is EndReason.CANCELLED
    retried_as = lifecycle.finish_session(job, cancelled=cancelled, end_reason=trajectory.end_reason)
    if retried_as is not None:
        store.put_verdict(session_verdict(trajectory, task.paper_category))  # every attempt's verdict is kept
        log.info(
            "task %d of %s: %s; it runs again as attempt %d after the retry delay",
            task.index,
            evaluation.id,
            trajectory.end_reason.value,
            retried_as,
        )
        return {"task": task.index, "end_reason": trajectory.end_reason.value, "retried_as_attempt": retried_as}
    if cancelled:
        log.info("task %d of %s: stopped, the evaluation was cancelled", task.index, evaluation.id)
        return {"task": task.index, "cancelled": True, "turns": trajectory.assistant_turns}
    log.info(
        "task %d of %s: %s after %d turns in %s",
        task.index,
        evaluation.id,
        trajectory.end_reason.value,
        trajectory.assistant_turns,
        trajectory.session.sandbox_name if trajectory.session else "no sandbox",
    )
    return {
        "task": task.index,
        "end_reason": trajectory.end_reason.value,
        "turns": trajectory.assistant_turns,
        "sandbox_id": trajectory.session.sandbox_id if trajectory.session else None,
    }


def _run(
    evaluation: Evaluation,
    task: Task,
    job: SessionJob,
    suite: Suite,
    settings: ExecutorSettings,
    backend: SandboxBackend,
    pool: WarmPool | None,
    api_key: str | None,
    state: StateStore,
    redis: Redis,
) -> SessionResult:
    """Run the session against the evaluation's endpoint (through its reply cache when it keeps one, charged to
    its spend when it has prices), asking ``state`` before each turn whether the evaluation was cancelled."""
    endpoint = EndpointClient(
        evaluation.model.base_url,
        evaluation.model.model,
        api_key=api_key,
        timeout_s=settings.MODEL_TIMEOUT_S,
        deadline_s=settings.MODEL_DEADLINE_S,
        max_reply_bytes=settings.MODEL_MAX_REPLY_BYTES,
        cap_setting="PBE_MODEL_MAX_REPLY_BYTES",
        transport=pinned_transport(EgressPolicy.parse(settings.EGRESS_ALLOWLIST)),
    )
    model = SessionModel(
        endpoint,
        evaluation,
        replies=ReplyCache(redis, evaluation.id) if evaluation.reply_cache else None,
        ledger=SpendLedger(redis, evaluation.id),
    )
    try:
        return run_task_session(
            evaluation,
            task,
            job.attempt,
            suite=suite,
            backend=backend,
            settings=settings,
            model=model,
            pool=pool,
            cancelled=lambda: state.cancelled(evaluation.id),
            spent_usd=model.spent_usd,
        )
    finally:
        endpoint.close()


def run_session(payload: dict[str, Any]) -> dict[str, Any]:
    """RQ entry point (``services.queues.RUN_SESSION_JOB``): validate the payload and run the session, with a
    sandbox from the warm pool the worker handed this thread (``executor.pool.SESSION_POOL``) when there is one."""
    job = SessionJob.model_validate(payload)
    settings = ExecutorSettings()
    redis = settings.redis()
    try:
        pool = SESSION_POOL.get()
        backend = pool.backend if pool is not None else get_backend(settings)
        with log_context(evaluation=job.evaluation_id, task=job.task_index, attempt=job.attempt):
            return execute_session(job, settings=settings, redis=redis, backend=backend, pool=pool)
    finally:
        redis.close()
