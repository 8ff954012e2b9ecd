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

Jobs have deterministic ids and a queued or running job is never queued twice, so running the reconciler
again, or on two gateways at once, duplicates nothing; verdicts are written per task, so a session graded
twice leaves one verdict. The gateway runs it every ``PBE_RECONCILE_INTERVAL_S`` seconds (one gateway at a
time, under a Redis lock); ``python -m gateway.reconcile`` runs it once.
"""

import logging
import sys
import threading
from dataclasses import dataclass, field

from redis import Redis
from redis.exceptions import RedisError
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from services.evaluation import TaskState
from services.lifecycle import TaskLifecycle
from services.queues import GradeJob, SessionJob, grade_job_id, session_job_id
from services.state import EvaluationNotFoundError
from services.store import ArtifactStore
from services.suite import Suite

log = logging.getLogger(__name__)

LOCK_KEY = "pbe:reconciler:lock"

_ALIVE = (JobStatus.QUEUED, JobStatus.STARTED, JobStatus.SCHEDULED, JobStatus.DEFERRED)


@dataclass
class Report:
    """What one pass did."""

    restored: list[str] = field(default_factory=list)
    """Evaluations brought back into Redis from the store."""
    sessions: list[str] = field(default_factory=list)
    """Session jobs queued again (their ids)."""
    gradings: list[str] = field(default_factory=list)
    """Grading jobs queued again (their ids)."""
    admitted: list[tuple[str, int]] = field(default_factory=list)
    """Tasks (evaluation, index) whose sessions were admitted from their window's line (not lost: waiting)."""


def _alive(redis: Redis, job_id: str) -> bool:
    """Whether a worker has the job or will take it: queued and in its queue, or started by a live worker."""
    if not Job.exists(job_id, redis):
        return False
    job = Job.fetch(job_id, connection=redis, serializer=JSONSerializer)
    status = job.get_status()
    if status is JobStatus.QUEUED:
        return redis.lpos(f"rq:queue:{job.origin}", job_id) is not None
    if status is JobStatus.STARTED:
        return bool(job.worker_name) and bool(redis.exists(f"rq:worker:{job.worker_name}"))
    return status in _ALIVE


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
            _reconcile_one(redis, lifecycle, store, evaluation_id, report)
        except (RedisError, OSError):
            raise
        except Exception:  # one broken evaluation must not stop the others, nor the reconciler
            log.exception("reconciler: evaluation %s skipped this pass", evaluation_id)
    return report


def _reconcile_one(
    redis: Redis, lifecycle: TaskLifecycle, store: ArtifactStore, evaluation_id: str, report: Report
) -> None:
    """Queue again the jobs of one evaluation that no worker has, then admit what its window has room for."""
    state = lifecycle.state
    lifecycle.hold_orphans(evaluation_id)
    for index, task_state in state.task_states(evaluation_id).items():
        attempt = state.task_attempt(evaluation_id, index)
        session = SessionJob(evaluation_id=evaluation_id, task_index=index, attempt=attempt)
        grading = GradeJob(evaluation_id=evaluation_id, task_index=index, attempt=attempt)
        if task_state is TaskState.QUEUED and lifecycle.is_held(evaluation_id, index):
            continue
        if task_state in (TaskState.QUEUED, TaskState.RUNNING):
            if not _alive(redis, session_job_id(session)):
                lifecycle.requeue_session(session)
                report.sessions.append(session_job_id(session))
        elif task_state is TaskState.GRADING and not _alive(redis, grade_job_id(grading)):
            if _alive(redis, session_job_id(session)):
                continue  # the session is still finishing
            if store.has_trajectory(evaluation_id, index, attempt):
                lifecycle.requeue_grading(grading)
                report.gradings.append(grade_job_id(grading))
            else:
                lifecycle.requeue_session(session)
                report.sessions.append(session_job_id(session))
    report.admitted.extend((evaluation_id, index) for index in lifecycle.admit(evaluation_id))


def run_periodically(
    redis: Redis, store: ArtifactStore, suite: Suite, interval_s: float, stop: threading.Event
) -> threading.Thread:
    """Run ``reconcile`` every ``interval_s`` seconds in a daemon thread, one gateway at a time, until ``stop``."""

    def loop() -> None:
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
    from services.suite import load_suite

    settings = GatewaySettings()
    report = reconcile(
        settings.redis(),
        ArtifactStore(settings.ARTIFACT_ROOT),
        load_suite(settings.require_suite(), settings.SUITE_NAME),
    )
    print(f"restored {report.restored}, sessions queued again {report.sessions}, gradings {report.gradings}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
