"""The queue contract: queue names, job function paths, deterministic job ids and job payloads.

The gateway enqueues a dotted path with a JSON payload and never imports executor or grader code. Job
payloads carry ids only: never an API key (the key stays in the secret store of ``services.state``).
Jobs are JSON on the wire (``rq.serializers.JSONSerializer``), never pickle: workers start with ``--serializer
rq.serializers.JSONSerializer`` (see ``docker-compose.yml``).
"""

from typing import Any

from pydantic import BaseModel
from redis import Redis
from rq.job import Job

SESSIONS_QUEUE = "pbe-sessions"
"""Executor workers take task sessions from this queue."""

GRADING_QUEUE = "pbe-grading"
"""Grader workers take finished sessions from this queue."""

RUN_SESSION_JOB = "executor.jobs.run_session"
"""Dotted path of the executor's job function."""

GRADE_SESSION_JOB = "grader.jobs.grade_session"
"""Dotted path of the grader's job function."""

PROJECT_JOBS = frozenset({RUN_SESSION_JOB, GRADE_SESSION_JOB})
"""The only job functions the project's workers run (``ProjectJob``)."""


class ForeignJobError(Exception):
    """A job names a function that is not one of ``PROJECT_JOBS``: it was refused before anything was imported."""


class ProjectJob(Job):
    """An RQ job that runs only the project's own job functions.

    Anything that can write to Redis can enqueue a job; a worker that imported and called whatever a job names
    would run it with the worker's rights (an executor holds the Docker socket). This job class refuses any other
    function before it is imported: the job fails with ``ForeignJobError``.
    """

    allowed: frozenset[str] = PROJECT_JOBS
    """The job functions this class runs."""

    @property
    def func(self) -> Any:
        if self.func_name not in self.allowed:
            raise ForeignJobError(
                f"job {self.id} names {self.func_name!r}, which is not a pybench-eval job function "
                f"({', '.join(sorted(PROJECT_JOBS))}): refused; something other than the service enqueued it"
            )
        return super().func


class ProjectJobsOnly:
    """A worker mixin: whatever job class the command line names, the worker's jobs are ``project_job_class``."""

    project_job_class: type[ProjectJob] = ProjectJob

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["job_class"] = self.project_job_class
        super().__init__(*args, **kwargs)


DEFAULT_SESSION_JOB_TIMEOUT_S = 3600
"""RQ's hard limit for one task session (ten turns of model calls and cells, with room to spare)."""

DEFAULT_GRADE_JOB_TIMEOUT_S = 600
"""RQ's hard limit for grading one session."""

DEFAULT_RESULT_TTL_S = 7 * 24 * 3600
"""How long RQ keeps finished job records (results themselves live in the artifact store)."""


class SessionJob(BaseModel):
    """The payload of one task session job."""

    evaluation_id: str
    task_index: int
    attempt: int = 1


class GradeJob(BaseModel):
    """The payload of one grading job."""

    evaluation_id: str
    task_index: int
    attempt: int = 1
    grading: int = 1
    """Which grading of the evaluation this is: 1 when its session ends, then one more per regrade."""


def session_job_id(job: SessionJob) -> str:
    """Return the deterministic RQ job id of a session: a re-enqueue of the same work reuses it."""
    return f"pbe-session-{job.evaluation_id}-{job.task_index}-a{job.attempt}"


def grade_job_id(job: GradeJob) -> str:
    """Return the deterministic RQ job id of a grading job."""
    regrade = f"-g{job.grading}" if job.grading > 1 else ""
    return f"pbe-grade-{job.evaluation_id}-{job.task_index}-a{job.attempt}{regrade}"


def enqueue(redis: Redis, queue: str, function: str, payload: BaseModel, *, job_id: str, timeout_s: int) -> Any:
    """Enqueue ``function`` (a dotted path) with the JSON payload, under a deterministic job id.

    A job id that is already queued or running is left alone, so enqueuing the same work twice runs it once.

    Returns:
        The RQ job.
    """
    from rq import Queue
    from rq.job import Job, JobStatus
    from rq.serializers import JSONSerializer

    rq_queue = Queue(queue, connection=redis, serializer=JSONSerializer)
    existing = Job.fetch(job_id, connection=redis, serializer=JSONSerializer) if Job.exists(job_id, redis) else None
    if existing is not None and existing.get_status() in (JobStatus.QUEUED, JobStatus.STARTED, JobStatus.SCHEDULED):
        return existing
    return rq_queue.enqueue_call(
        function,
        args=(payload.model_dump(mode="json"),),
        job_id=job_id,
        timeout=timeout_s,
        result_ttl=DEFAULT_RESULT_TTL_S,
        failure_ttl=DEFAULT_RESULT_TTL_S,
    )


def cancel_job(redis: Redis, job_id: str) -> bool:
    """Cancel a queued job (a started one runs on). Returns whether a queued job was cancelled."""
    from rq.job import Job, JobStatus
    from rq.serializers import JSONSerializer

    if not Job.exists(job_id, redis):
        return False
    job = Job.fetch(job_id, connection=redis, serializer=JSONSerializer)
    if job.get_status() not in (JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.DEFERRED):
        return False
    job.cancel()
    return True


def drop_job(redis: Redis, job_id: str) -> None:
    """Delete the record of a job no worker has, so that it can be queued again under its id; a record RQ
    half-wrote or half-deleted (a worker killed mid-job) is dropped all the same."""
    from rq.exceptions import NoSuchJobError
    from rq.job import Job
    from rq.serializers import JSONSerializer

    if not Job.exists(job_id, redis):
        return
    try:
        Job.fetch(job_id, connection=redis, serializer=JSONSerializer).delete()
    except (NoSuchJobError, ValueError):
        # rq raises ValueError when the job's execution record is gone: remove what is left by hand.
        redis.delete(f"rq:job:{job_id}", f"rq:job:{job_id}:dependents", f"rq:job:{job_id}:dependencies")


def enqueue_session(redis: Redis, job: SessionJob) -> Any:
    """Queue a task session under its deterministic id (see ``enqueue``). Returns the RQ job."""
    return enqueue(
        redis, SESSIONS_QUEUE, RUN_SESSION_JOB, job, job_id=session_job_id(job), timeout_s=DEFAULT_SESSION_JOB_TIMEOUT_S
    )


def enqueue_grading(redis: Redis, job: GradeJob) -> Any:
    """Queue the grading of a finished session under its deterministic id (see ``enqueue``). Returns the RQ job."""
    return enqueue(
        redis, GRADING_QUEUE, GRADE_SESSION_JOB, job, job_id=grade_job_id(job), timeout_s=DEFAULT_GRADE_JOB_TIMEOUT_S
    )


RETRIES_KEY = "pbe:retries"
"""Sorted set of session jobs to be queued later (a retry waiting out its delay): member the ``SessionJob`` as JSON,
score the Unix time from which it may run. ``release_due_sessions`` moves the due ones onto the sessions queue;
until then the job holds no executor slot (its task keeps its place in the evaluation's admission window)."""

RELEASE_BATCH = 100
"""The most scheduled sessions one ``release_due_sessions`` call queues."""


def _member(job: SessionJob) -> str:
    return job.model_dump_json()


def schedule_session(redis: Redis, job: SessionJob, not_before: float) -> None:
    """Queue the session of ``job`` at ``not_before`` (Unix time) instead of now."""
    redis.zadd(RETRIES_KEY, {_member(job): not_before})


def unschedule_session(redis: Redis, job: SessionJob) -> bool:
    """Take a scheduled session out of line (its evaluation was cancelled). Returns whether it was scheduled."""
    return bool(redis.zrem(RETRIES_KEY, _member(job)))


def release_due_sessions(redis: Redis, now: float) -> list[SessionJob]:
    """Queue the scheduled sessions whose time has come (at most ``RELEASE_BATCH``); each is released once, by
    whichever caller removes it from the set first (any number of executors and reconcilers may call this at
    once). Returns the sessions queued here. An entry that is not a session job is dropped."""
    released = []
    for raw in redis.zrangebyscore(RETRIES_KEY, 0, now, start=0, num=RELEASE_BATCH):
        if not isinstance(raw, bytes | str) or not redis.zrem(RETRIES_KEY, raw):
            continue  # another caller released it
        try:
            job = SessionJob.model_validate_json(raw)
        except ValueError:
            continue
        enqueue_session(redis, job)
        released.append(job)
    return released


def job_alive(redis: Redis, job_id: str) -> bool:
    """Whether a worker has the job or will take it: queued and in its queue, scheduled or deferred by rq, or
    started by a worker whose heartbeat lives (``services.live.liveness``)."""
    from rq.job import Job, JobStatus
    from rq.serializers import JSONSerializer

    if not Job.exists(job_id, redis):
        return False
    job = Job.fetch(job_id, connection=redis, serializer=JSONSerializer)
    status = job.get_status()
    if status is JobStatus.QUEUED:
        return redis.lpos(f"rq:queue:{job.origin}", job_id) is not None
    if status is JobStatus.STARTED:
        return bool(job.worker_name) and bool(redis.exists(f"rq:worker:{job.worker_name}"))
    return status in (JobStatus.SCHEDULED, JobStatus.DEFERRED)


def session_alive(redis: Redis, job: SessionJob) -> bool:
    """Whether the session of ``job`` will run or runs: its rq job is alive (``job_alive``), or it waits in
    ``RETRIES_KEY`` for its time."""
    return redis.zscore(RETRIES_KEY, _member(job)) is not None or job_alive(redis, session_job_id(job))
