"""Regrading: a finished evaluation graded again from its stored sessions, with a new judge, starting no session
and calling no model; the earlier verdicts stay in the store."""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

from gateway.app import create_app
from gateway.reconcile import reconcile
from grader.jobs import grade_and_record
from services.lifecycle import TaskLifecycle
from services.netguard import EgressPolicy
from services.queues import GRADING_QUEUE, SESSIONS_QUEUE, GradeJob, SessionJob
from services.store import ArtifactStore
from services.suite import load_suite
from services.trajectory import EndReason, Message, Trajectory
from tests.fixtures import ADMIN_KEY, gateway_settings, test_secrets
from tests.judge_server import JudgeServer, Step
from tests.servers import serve

TASKS = [44, 134]
LOOPBACK = EgressPolicy.parse("127.0.0.1")


@pytest.fixture()
def api(redis_url: str, redis_client: Redis, suite_path: Path, tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(gateway_settings(redis_url, suite_path, tmp_path))) as client:
        client.headers["Authorization"] = f"Bearer {ADMIN_KEY}"
        yield client


def _grade_queued(redis: Redis, suite_path: Path, store: ArtifactStore) -> list[GradeJob]:
    """Run every grading job waiting in the queue, as a grader worker would (the checks' sandboxes aside)."""
    queue = Queue(GRADING_QUEUE, connection=redis, serializer=JSONSerializer)
    jobs = []
    for job_id in queue.job_ids:
        job = queue.fetch_job(job_id)
        assert job is not None
        grade = GradeJob.model_validate(job.args[0])
        grade_and_record(
            grade, redis=redis, suite=load_suite(suite_path), store=store, egress=LOOPBACK, secrets=test_secrets()
        )
        queue.remove(job_id)
        jobs.append(grade)
    return jobs


def test_a_finished_evaluation_is_graded_again_with_a_new_judge_and_no_session(
    api: TestClient, redis_client: Redis, suite_path: Path, tmp_path: Path
) -> None:
    body = {"model": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}, "tasks": TASKS, "prompt": "gpt"}
    evaluation_id = api.post("/v1/evaluations", json=body).json()["evaluation"]["id"]
    Queue(SESSIONS_QUEUE, connection=redis_client).empty()  # type: ignore[no-untyped-call]  # the sessions "ran"
    store = ArtifactStore(tmp_path)
    lifecycle = TaskLifecycle(redis_client)
    for index, answer in ((44, "Finished: saved"), (134, "Finished: no idea")):
        store.put_trajectory(
            Trajectory(
                evaluation_id=evaluation_id,
                task_index=index,
                attempt=1,
                end_reason=EndReason.NO_CODE,
                messages=[Message(role="user", content="q"), Message(role="assistant", content=answer)],
            )
        )
        session = SessionJob(evaluation_id=evaluation_id, task_index=index)
        lifecycle.start(session)
        lifecycle.finish_session(session)
    first = _grade_queued(redis_client, suite_path, store)
    assert [j.grading for j in first] == [1, 1]
    before = api.get(f"/v1/evaluations/{evaluation_id}/results").json()
    assert before["complete"] and all(v["judgment"] is None for v in before["verdicts"])

    refused = api.post(f"/v1/evaluations/{evaluation_id}/regrade", json={"judge": {"endpoint": {
        "base_url": "http://127.0.0.2:9/v1", "model": "j"}}})  # fmt: skip
    assert refused.status_code == 403  # a loopback address not on the allowlist: refused before any connection

    server = JudgeServer()
    server.script(
        Step(content=json.dumps({"reason": "fine", "passed": True})),
        Step(content=json.dumps({"reason": "no", "passed": False})),
    )
    with serve(server.app) as url:
        judge = {"endpoint": {"base_url": url + "/v1", "model": "judge-2"}}
        answer = api.post(f"/v1/evaluations/{evaluation_id}/regrade", json={"judge": judge})
        assert answer.status_code == 200, answer.text
        assert answer.json()["evaluation"]["grading"] == 2 and answer.json()["status"] == "running"
        second = _grade_queued(redis_client, suite_path, store)
    assert sorted((j.task_index, j.grading) for j in second) == [(44, 2), (134, 2)]
    assert Queue(SESSIONS_QUEUE, connection=redis_client).count == 0, "a regrade starts no session"
    assert len(server.requests) == 2, "the new judge read each trajectory once"
    after = api.get(f"/v1/evaluations/{evaluation_id}/results").json()
    assert after["complete"] and {v["grading"] for v in after["verdicts"]} == {2}
    assert {v["judgment"]["judge_model"] for v in after["verdicts"]} == {"judge-2"}
    assert [v["status"] for v in after["verdicts"]] == [v["status"] for v in before["verdicts"]]
    assert "judge" in after["statistics"]
    for index in TASKS:
        folder = store.attempt_dir(evaluation_id, index, 1)
        kept = json.loads((folder / "verdict-grading-1.json").read_text())
        assert kept["grading"] == 1 and kept["judgment"] is None
        assert json.loads((folder / "verdict.json").read_text())["grading"] == 2
    running = api.post("/v1/evaluations", json=body).json()["evaluation"]["id"]
    assert api.post(f"/v1/evaluations/{running}/regrade").status_code == 409


def test_the_reconciler_queues_a_lost_regrade_again_as_the_regrade_it_was(
    api: TestClient, redis_client: Redis, suite_path: Path, tmp_path: Path
) -> None:
    body = {"model": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}, "tasks": [44], "prompt": "gpt"}
    evaluation_id = api.post("/v1/evaluations", json=body).json()["evaluation"]["id"]
    Queue(SESSIONS_QUEUE, connection=redis_client).empty()  # type: ignore[no-untyped-call]  # the session "ran"
    store = ArtifactStore(tmp_path)
    store.put_trajectory(
        Trajectory(evaluation_id=evaluation_id, task_index=44, attempt=1, end_reason=EndReason.NO_CODE, messages=[])
    )
    lifecycle = TaskLifecycle(redis_client)
    session = SessionJob(evaluation_id=evaluation_id, task_index=44)
    lifecycle.start(session)
    lifecycle.finish_session(session)
    _grade_queued(redis_client, suite_path, store)
    assert api.post(f"/v1/evaluations/{evaluation_id}/regrade").status_code == 200
    queue = Queue(GRADING_QUEUE, connection=redis_client, serializer=JSONSerializer)
    for job_id in queue.job_ids:  # the regrade's job is lost (Redis dropped it)
        queue.remove(job_id)
        redis_client.delete(f"rq:job:{job_id}")
    reconcile(redis_client, store, load_suite(suite_path))
    (requeued,) = [GradeJob.model_validate(queue.fetch_job(j).args[0]) for j in queue.job_ids]  # type: ignore[union-attr]
    assert requeued.grading == 2
