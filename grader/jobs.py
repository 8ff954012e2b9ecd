"""The grader's RQ job: grade one finished session, record the verdict, and the results once all are in.

Workers run ``rq worker --serializer rq.serializers.JSONSerializer pbe-grading``; the executor enqueues
``grader.jobs.grade_session`` by name with a ``GradeJob`` payload.
"""

from typing import Any

from redis import Redis

from grader.grading import grade
from grader.settings import GraderSettings
from services.metrics import build_results
from services.queues import GradeJob
from services.state import StateStore
from services.store import ArtifactStore
from services.suite import Suite, load_suite


def grade_and_record(job: GradeJob, *, redis: Redis, suite: Suite, store: ArtifactStore) -> dict[str, Any]:
    """Grade the session of ``job``; write the verdict to the store and Redis, and the results when complete.

    Raises:
        ArtifactNotFoundError: the session's trajectory is not in the store.
        TaskNotFoundError: the suite has no such task.
    """
    task = suite.task(job.task_index)
    trajectory = store.get_trajectory(job.evaluation_id, job.task_index, job.attempt)
    verdict = grade(task, trajectory, store.list_output_files(job.evaluation_id, job.task_index, job.attempt))
    store.put_verdict(verdict)
    state = StateStore(redis)
    state.put_verdict(verdict)
    progress = state.progress(job.evaluation_id)
    if progress.finished == progress.total:
        store.put_results(build_results(job.evaluation_id, state.verdicts(job.evaluation_id), complete=True))
    return {"task": task.index, "status": verdict.status.value}


def grade_session(payload: dict[str, Any]) -> dict[str, Any]:
    """RQ entry point (``services.queues.GRADE_SESSION_JOB``): validate the payload and grade."""
    job = GradeJob.model_validate(payload)
    settings = GraderSettings()
    redis = Redis.from_url(settings.REDIS_URL)
    try:
        suite = load_suite(settings.require_suite())
        return grade_and_record(job, redis=redis, suite=suite, store=ArtifactStore(settings.ARTIFACT_ROOT))
    finally:
        redis.close()
