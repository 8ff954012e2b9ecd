"""The reconciler against a real Redis that is restarted (append-only file kept) or loses everything: nothing an
evaluation accepted is lost, and nothing is queued or recorded twice."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from redis import Redis
from rq import Queue
from rq.job import Job, JobStatus
from rq.results import Result
from rq.serializers import JSONSerializer

from gateway.app import create_app
from gateway.reconcile import reconcile
from gateway.settings import GatewaySettings
from services.evaluation import TaskState
from services.lifecycle import MAX_REQUEUES, TaskLifecycle
from services.pybench.suite import Suite, load_suite
from services.queues import GRADING_QUEUE, SESSIONS_QUEUE, SessionJob
from services.state import StateStore
from services.store import ArtifactStore
from services.verdict import Results, VerdictStatus
from tests.factories import make_submission, make_trajectory, make_verdict
from tests.servers import RedisServer

ADMIN_KEY = "pbe-test-admin-reconcile"


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[RedisServer]:
    folder = tmp_path / "redis"
    folder.mkdir()
    server = RedisServer(folder)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def suite(suite_path: Path) -> Suite:
    return load_suite(suite_path)


def submit(server: RedisServer, suite_path: Path, artifacts: Path, tasks: list[int]) -> str:
    settings = GatewaySettings(
        REDIS_URL=server.url,
        SUITE_PATH=suite_path,
        ARTIFACT_ROOT=artifacts,
        ADMIN_KEY=ADMIN_KEY,  # type: ignore[arg-type]
        EGRESS_ALLOWLIST="127.0.0.1",
        RECONCILE_INTERVAL_S=0,
        PREFLIGHT=False,
    )
    with TestClient(create_app(settings)) as client:
        response = client.post(
            "/v1/evaluations",
            json=make_submission(tasks),
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        )
        assert response.status_code == 201, response.text
        return str(response.json()["evaluation"]["id"])


def jobs(redis: Redis, queue: str) -> list[str]:
    return sorted(Queue(queue, connection=redis, serializer=JSONSerializer).job_ids)


def in_flight(redis: Redis, store: ArtifactStore, evaluation_id: str) -> None:
    """Put the evaluation of tasks [7, 16, 30, 44, 13] mid-run, as workers would, with the work of two lost:
    7 done; 16 started by an executor that died; 30 graded-to-be, trajectory stored, its grading job gone;
    44 still queued; 13 unavailable."""
    lifecycle = TaskLifecycle(redis)
    sessions = Queue(SESSIONS_QUEUE, connection=redis, serializer=JSONSerializer)
    for index in (7, 16, 30):
        sessions.remove(f"pbe-session-{evaluation_id}-{index}-a1")
    crashed = Job.fetch(f"pbe-session-{evaluation_id}-16-a1", connection=redis, serializer=JSONSerializer)
    crashed.set_status(JobStatus.STARTED)
    redis.hset(crashed.key, "worker_name", "executor-that-died")
    done = make_verdict(evaluation_id, 7, VerdictStatus.PASSED)
    store.put_verdict(done)
    lifecycle.record_verdict(done)
    lifecycle.start(SessionJob(evaluation_id=evaluation_id, task_index=16))
    store.put_trajectory(make_trajectory(evaluation_id, 30, "Finished: 5478", query=None))
    lifecycle.finish_session(SessionJob(evaluation_id=evaluation_id, task_index=30))
    Queue(GRADING_QUEUE, connection=redis, serializer=JSONSerializer).remove(f"pbe-grade-{evaluation_id}-30-a1")


def test_after_a_redis_crash_lost_work_is_queued_again_once(
    server: RedisServer, suite: Suite, suite_path: Path, tmp_path: Path
) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    evaluation_id = submit(server, suite_path, store.root, [7, 16, 30, 44, 13])
    redis = Redis.from_url(server.url)
    in_flight(redis, store, evaluation_id)
    redis.close()
    server.stop()
    server.start()
    redis = Redis.from_url(server.url)
    state = StateStore(redis)
    assert state.get(evaluation_id).tasks == [7, 16, 30, 44, 13]  # the append-only file kept it

    first = reconcile(redis, store, suite)
    assert first.restored == []
    assert sorted(first.sessions) == [f"pbe-session-{evaluation_id}-16-a1"]
    assert first.gradings == [f"pbe-grade-{evaluation_id}-30-a1"]
    assert jobs(redis, SESSIONS_QUEUE) == [f"pbe-session-{evaluation_id}-{i}-a1" for i in (16, 44)]
    assert jobs(redis, GRADING_QUEUE) == [f"pbe-grade-{evaluation_id}-30-a1"]
    states = state.task_states(evaluation_id)
    assert (states[7], states[16], states[30], states[13]) == (
        TaskState.DONE,
        TaskState.QUEUED,
        TaskState.GRADING,
        TaskState.UNAVAILABLE,
    )

    again = reconcile(redis, store, suite)  # nothing more to do: no duplicate job, no duplicate verdict
    assert (again.restored, again.sessions, again.gradings) == ([], [], [])
    assert len(jobs(redis, SESSIONS_QUEUE)) == 2 and len(jobs(redis, GRADING_QUEUE)) == 1
    assert [v.task_index for v in state.verdicts(evaluation_id)] == [7, 13]
    redis.close()


def test_an_evaluation_redis_lost_entirely_is_restored_from_the_store(
    server: RedisServer, suite: Suite, suite_path: Path, tmp_path: Path
) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    evaluation_id = submit(server, suite_path, store.root, [7, 16, 30, 44, 13])
    redis = Redis.from_url(server.url)
    in_flight(redis, store, evaluation_id)
    redis.flushall()  # a Redis without persistence, restarted

    report = reconcile(redis, store, suite)
    assert report.restored == [evaluation_id]
    state = StateStore(redis)
    assert state.get(evaluation_id).owner == "admin"
    states = state.task_states(evaluation_id)
    assert states[7] is TaskState.DONE and states[13] is TaskState.UNAVAILABLE
    assert [v.task_index for v in state.verdicts(evaluation_id)] == [7, 13]
    # the restored tasks come back through the admission window (held, then admitted), not as lost jobs
    assert report.sessions == [] and sorted(report.admitted) == [(evaluation_id, i) for i in (16, 30, 44)]
    assert jobs(redis, SESSIONS_QUEUE) == [f"pbe-session-{evaluation_id}-{i}-a1" for i in (16, 30, 44)]
    again = reconcile(redis, store, suite)
    assert again.sessions == [] and again.admitted == []  # queued once
    redis.close()


def crash(redis: Redis, job_id: str, error: str) -> None:
    """What a worker records when a job's function raises: the job failed, its error kept, off its queue."""
    job = Job.fetch(job_id, connection=redis, serializer=JSONSerializer)
    Queue(job.origin, connection=redis, serializer=JSONSerializer).remove(job_id)
    job.set_status(JobStatus.FAILED)
    Result.create_failure(job, ttl=600, exc_string=f"Traceback (most recent call last):\n  ...\n{error}\n")


def test_a_session_that_crashes_every_time_is_given_up_after_the_requeue_cap_with_its_error(
    server: RedisServer, suite: Suite, suite_path: Path, tmp_path: Path
) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    evaluation_id = submit(server, suite_path, store.root, [7, 16])
    redis = Redis.from_url(server.url)
    state = StateStore(redis)
    poison = f"pbe-session-{evaluation_id}-16-a1"
    error = "RecursionError: maximum recursion depth exceeded while decoding a JSON object"
    done = make_verdict(evaluation_id, 7, VerdictStatus.PASSED)
    Queue(SESSIONS_QUEUE, connection=redis, serializer=JSONSerializer).remove(f"pbe-session-{evaluation_id}-7-a1")
    store.put_verdict(done)
    TaskLifecycle(redis).record_verdict(done)
    crash(redis, poison, error)
    for _ in range(MAX_REQUEUES):  # each pass queues the crashed job again, and it crashes again
        report = reconcile(redis, store, suite)
        assert (report.sessions, report.given_up) == ([poison], [])
        assert state.task_states(evaluation_id)[16] is TaskState.QUEUED
        crash(redis, poison, error)

    last = reconcile(redis, store, suite)
    assert (last.sessions, last.given_up) == ([], [poison])
    verdict = {v.task_index: v for v in state.verdicts(evaluation_id)}[16]
    assert (verdict.status, verdict.retryable, verdict.attempt) == (VerdictStatus.INFRA_ERROR, False, 1)
    assert f"crashed {MAX_REQUEUES + 1} times" in verdict.reason and error in verdict.reason
    assert state.task_states(evaluation_id)[16] is TaskState.DONE and state.complete(evaluation_id)
    assert store.latest_verdict(evaluation_id, 16) == verdict
    results = Results.model_validate_json((store.evaluation_dir(evaluation_id) / "results.json").read_bytes())
    assert results.complete and results.metrics.by_status[VerdictStatus.INFRA_ERROR] == 1
    after = reconcile(redis, store, suite)  # nothing is queued again, ever
    assert (after.sessions, after.gradings, after.given_up) == ([], [], [])
    assert jobs(redis, SESSIONS_QUEUE) == []
    redis.close()


def test_a_session_whose_worker_died_under_it_is_still_queued_again_up_to_the_cap(
    server: RedisServer, suite: Suite, suite_path: Path, tmp_path: Path
) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    evaluation_id = submit(server, suite_path, store.root, [44])
    redis = Redis.from_url(server.url)
    lifecycle = TaskLifecycle(redis)
    job_id = f"pbe-session-{evaluation_id}-44-a1"
    for lost in range(1, MAX_REQUEUES + 2):
        Queue(SESSIONS_QUEUE, connection=redis, serializer=JSONSerializer).remove(job_id)
        job = Job.fetch(job_id, connection=redis, serializer=JSONSerializer)
        job.set_status(JobStatus.STARTED)
        redis.hset(job.key, "worker_name", "executor-that-died")
        report = reconcile(redis, store, suite)
        assert lifecycle.requeues(evaluation_id, 44, 1) == lost
        assert report.sessions == ([job_id] if lost <= MAX_REQUEUES else [])
    verdict = lifecycle.state.verdicts(evaluation_id)[0]
    assert verdict.status is VerdictStatus.INFRA_ERROR and "its worker died while running it" in verdict.reason
    redis.close()
