"""The reconciler: work an accepted evaluation still needs is queued again when a crash dropped it.

An evaluation is written to the artifact store before its jobs are queued, and every finished session leaves
its trajectory and verdict there, so the store can always say what remains. The reconciler:

1. restores into Redis an evaluation the store has and Redis lost (Redis ran without persistence and
   restarted): its tasks come back ``done`` with their stored verdicts, or ``queued`` (the model and judge keys
   were in Redis only: a session then stops before calling the endpoint, with a model error that says to send
   them again with ``PUT /v1/evaluations/<id>/keys``; the log says so too);
2. for each evaluation still running, queues again the job a task waits on when no worker has it:
   a ``queued`` (and admitted) or ``running`` task's session (the executor crashed, or its job was lost), a
   ``grading`` task's grading (or its session, when its trajectory never reached the store); a ``queued`` task
   held in the admission window has no job by design and waits its turn;
3. fills each evaluation's admission window again (a crash between a session's end and the next admission).

The same attempt's job is queued again at most ``services.lifecycle.MAX_REQUEUES`` times: a job that crashes
whenever it runs (its exception escaped the job, or it killed its worker) then ends its task with an
``infra_error`` whose reason says how often it was lost and the job's last error, and the evaluation completes.

Jobs have deterministic ids and a queued or running job is never queued twice, so running the reconciler
again, or on two gateways at once, duplicates nothing; verdicts are written per task, so a session graded
twice leaves one verdict. The gateway runs it every ``PBE_RECONCILE_INTERVAL_S`` seconds (one gateway at a
time, under a Redis lock); ``python -m gateway.reconcile`` runs it once.

Each pass is followed by one bounded retention pass (``services.live.retention.expire_old``: old evaluations'
trajectories and files removed after ``PBE_RETENTION_DAYS``).
"""

import logging
import sys
import threading
import time
from dataclasses import dataclass, field

from redis import Redis
from redis.exceptions import RedisError
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from services.evaluation import TaskState
from services.lifecycle import MAX_REQUEUES, TaskLifecycle
from services.live.retention import RetentionPolicy, expire_old
from services.pybench.suite import Suite
from services.queues import (
    GradeJob,
    SessionJob,
    grade_job_id,
    job_alive,
    release_due_sessions,
    session_alive,
    session_job_id,
)
from services.results.scores import build_results
from services.state import EvaluationNotFoundError
from services.store import ArtifactStore
from services.verdict import Verdict, VerdictStatus

log = logging.getLogger(__name__)

LOCK_KEY = "pbe:reconciler:lock"


@dataclass
class Report:
    """What one pass did."""

    restored: list[str] = field(default_factory=list)
    """Evaluations brought back into Redis from the store."""
    sessions: list[str] = field(default_factory=list)
    """Session jobs queued again (their ids)."""
    released: list[str] = field(default_factory=list)
    """Retries whose delay was over, queued (their ids; executors release them first, within a second)."""
    gradings: list[str] = field(default_factory=list)
    """Grading jobs queued again (their ids)."""
    given_up: list[str] = field(default_factory=list)
    """Jobs lost more than ``MAX_REQUEUES`` times, whose tasks were ended with an ``infra_error`` (their ids)."""
    admitted: list[tuple[str, int]] = field(default_factory=list)
    """Tasks (evaluation, index) whose sessions were admitted from their window's line (not lost: waiting)."""


def _last_error(redis: Redis, job_id: str) -> str:
    """The last line of a failed job's error (what escaped the job function), at most 300 characters, or ''."""
    try:
        job = Job.fetch(job_id, connection=redis, serializer=JSONSerializer)
    except Exception:  # no such job, or a record that no longer parses: nothing to say
        return ""
    if job.get_status() is not JobStatus.FAILED:
        return ""
    result = job.latest_result()
    text = (result.exc_string if result is not None else None) or ""
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _give_up(
    lifecycle: TaskLifecycle, store: ArtifactStore, suite: Suite, job: SessionJob | GradeJob, job_id: str
) -> None:
    """End the task of ``job``, lost or crashed more than ``MAX_REQUEUES`` times, with an ``infra_error``."""
    what = "session" if isinstance(job, SessionJob) else "grading"
    error = _last_error(lifecycle.redis, job_id)
    task = suite.tasks.get(job.task_index)
    verdict = Verdict(
        evaluation_id=job.evaluation_id,
        task_index=job.task_index,
        attempt=job.attempt,
        paper_category=task.paper_category if task is not None else "",
        status=VerdictStatus.INFRA_ERROR,
        reason=(
            f"the {what} job of attempt {job.attempt} was lost or crashed {MAX_REQUEUES + 1} times and was not "
            f"queued again"
            + (f"; its last error: {error}" if error else " (its worker died while running it)")
            + "; POST .../retry runs the task again once the cause is fixed"
        ),
        retryable=False,
    )
    store.put_verdict(verdict)
    if lifecycle.give_up(verdict).complete:
        evaluation = lifecycle.state.get(job.evaluation_id)
        verdicts = lifecycle.state.verdicts(job.evaluation_id)
        store.put_results(build_results(job.evaluation_id, verdicts, complete=True, prices=evaluation.prices))
        store.put_evaluation(evaluation)  # its manifest's gradings, filled in at completion
    log.error("reconciler: %s, task %s: %s", job.evaluation_id, job.task_index, verdict.reason)


def _requeue(
    lifecycle: TaskLifecycle,
    store: ArtifactStore,
    suite: Suite,
    job: SessionJob | GradeJob,
    report: Report,
) -> None:
    """Queue ``job`` again, or give its task up when its attempt was lost ``MAX_REQUEUES`` times already."""
    job_id = session_job_id(job) if isinstance(job, SessionJob) else grade_job_id(job)
    if lifecycle.count_requeue(job.evaluation_id, job.task_index, job.attempt) > MAX_REQUEUES:
        _give_up(lifecycle, store, suite, job, job_id)
        report.given_up.append(job_id)
    elif isinstance(job, SessionJob):
        lifecycle.requeue_session(job)
        report.sessions.append(job_id)
    else:
        lifecycle.requeue_grading(job)
        report.gradings.append(job_id)


def restore(lifecycle: TaskLifecycle, store: ArtifactStore, suite: Suite, evaluation_id: str) -> None:
    """Bring an evaluation back into Redis from the store (``TaskLifecycle.restore``)."""
    evaluation = store.get_evaluation(evaluation_id)
    stored = {index: store.latest_verdict(evaluation.id, index) for index in evaluation.tasks}
    lifecycle.restore(evaluation, suite, {index: v for index, v in stored.items() if v is not None})
    if evaluation.has_api_key or evaluation.has_judge_api_key:
        log.warning(
            "evaluation %s was restored without its API keys (they were in Redis only): its owner must send them "
            "again (PUT /v1/evaluations/%s/keys) before its sessions can call the endpoint",
            evaluation.id,
            evaluation.id,
        )


def reconcile(redis: Redis, store: ArtifactStore, suite: Suite) -> Report:
    """One pass over every evaluation (see the module's description). Returns what it did.

    An evaluation that cannot be reconciled (a record Redis or the store half-holds) is logged and skipped: the
    pass goes on with the others.
    """
    lifecycle = TaskLifecycle(redis)
    state = lifecycle.state
    report = Report()
    report.released.extend(session_job_id(job) for job in release_due_sessions(redis, time.time()))
    for evaluation_id in store.evaluation_ids():
        try:
            state.get(evaluation_id)
        except EvaluationNotFoundError:
            restore(lifecycle, store, suite, evaluation_id)
            report.restored.append(evaluation_id)
    for evaluation_id, _ in state.evaluation_ids(None, limit=100_000):
        if state.cancelled(evaluation_id):
            continue
        try:
            _reconcile_one(redis, lifecycle, store, suite, evaluation_id, report)
        except (RedisError, OSError):
            raise
        except Exception:  # one broken evaluation must not stop the others, nor the reconciler
            log.exception("reconciler: evaluation %s skipped this pass", evaluation_id)
    return report


def _reconcile_one(
    redis: Redis, lifecycle: TaskLifecycle, store: ArtifactStore, suite: Suite, evaluation_id: str, report: Report
) -> None:
    """Queue again the jobs of one evaluation that no worker has, then admit what its window has room for."""
    state = lifecycle.state
    lifecycle.hold_orphans(evaluation_id)
    gradings: int | None = None  # the evaluation's grading count, read once, only when a task is grading
    for index, task_state in state.task_states(evaluation_id).items():
        attempt = state.task_attempt(evaluation_id, index)
        session = SessionJob(evaluation_id=evaluation_id, task_index=index, attempt=attempt)
        if task_state is TaskState.QUEUED and lifecycle.is_held(evaluation_id, index):
            continue
        if task_state in (TaskState.QUEUED, TaskState.RUNNING):
            if not session_alive(redis, session):
                _requeue(lifecycle, store, suite, session, report)
            continue
        if task_state is not TaskState.GRADING:
            continue
        if gradings is None:  # a regrade's jobs carry its number (and their own ids)
            gradings = state.get(evaluation_id).grading
        grading = GradeJob(evaluation_id=evaluation_id, task_index=index, attempt=attempt, grading=gradings)
        if not job_alive(redis, grade_job_id(grading)):
            if session_alive(redis, session):
                continue  # the session is still finishing
            if store.has_trajectory(evaluation_id, index, attempt):
                _requeue(lifecycle, store, suite, grading, report)
            else:
                _requeue(lifecycle, store, suite, session, report)
    report.admitted.extend((evaluation_id, index) for index in lifecycle.admit(evaluation_id))


def _retention_policy() -> RetentionPolicy:
    """The retention of the gateway's settings as its environment gives them (``PBE_RETENTION_DAYS``); when they do
    not validate, none (nothing is removed), logged."""
    from gateway.settings import GatewaySettings

    try:
        return RetentionPolicy(days=GatewaySettings().RETENTION_DAYS)
    except ValueError as exc:  # pydantic's ValidationError
        log.error("retention: off, the settings do not validate: %s", exc)
        return RetentionPolicy(days=0)


def expire(redis: Redis, store: ArtifactStore, retention: RetentionPolicy) -> None:
    """One retention pass (``services.live.retention.expire_old``), logged when it removed anything.

    Raises:
        RedisError: Redis cannot be reached.
    """
    report = expire_old(redis, store, retention)
    if report.expired:
        log.warning(
            "retention: removed the trajectories and files of %d evaluation(s) that finished more than %d days ago "
            "(%.1f MiB): %s",
            len(report.expired),
            retention.days,
            report.freed_bytes / (1024 * 1024),
            ", ".join(report.expired),
        )


def run_periodically(
    redis: Redis,
    store: ArtifactStore,
    suite: Suite,
    interval_s: float,
    stop: threading.Event,
    retention: RetentionPolicy | None = None,
) -> threading.Thread:
    """Run ``reconcile``, then a retention pass (``expire``), every ``interval_s`` seconds in a daemon thread, one
    gateway at a time, until ``stop``. ``retention`` None: the policy of ``GatewaySettings()``, read when the
    thread starts (the gateway's own, when its settings come from the environment)."""

    def loop() -> None:
        policy = retention or _retention_policy()
        while not stop.wait(interval_s):
            try:
                if redis.set(LOCK_KEY, "1", nx=True, ex=max(1, int(interval_s))):
                    report = reconcile(redis, store, suite)
                    if report.restored or report.sessions or report.gradings:
                        log.warning(
                            "reconciler: restored %d evaluation(s), queued %d session(s) and %d grading(s) again",
                            len(report.restored),
                            len(report.sessions),
                            len(report.gradings),
                        )
                    expire(redis, store, policy)
            except (RedisError, OSError) as exc:
                log.warning("reconciler: pass skipped (%s: %s); next in %.0f s", type(exc).__name__, exc, interval_s)
            except Exception:  # the thread must outlive any one pass; /health reports it if it dies anyway
                log.exception("reconciler: pass failed; next in %.0f s", interval_s)

    thread = threading.Thread(target=loop, name="pbe-reconciler", daemon=True)
    thread.start()
    return thread


def main() -> int:
    """Run one pass with the gateway's settings and print what it did."""
    from gateway.settings import GatewaySettings
    from services.pybench.suite import load_suite

    settings = GatewaySettings()
    redis, store = settings.redis(), ArtifactStore(settings.ARTIFACT_ROOT)
    report = reconcile(redis, store, load_suite(settings.require_suite(), settings.SUITE_NAME))
    print(f"restored {report.restored}, sessions queued again {report.sessions}, gradings {report.gradings}")
    expired = expire_old(redis, store, RetentionPolicy(days=settings.RETENTION_DAYS))
    print(f"retention ({settings.RETENTION_DAYS} days): expired {expired.expired}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
