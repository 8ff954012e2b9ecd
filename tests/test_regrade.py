"""Regrading: a finished evaluation graded again from its stored sessions, with a new judge, starting no session
and calling no model; the earlier verdicts stay in the store, the manifest lists every grading with what graded it,
and the comparable key follows the checks the verdicts were graded with."""

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
from grader import grading
from grader.jobs import grade_and_record
from grader.variants import VARIANTS
from services.endpoint.netguard import EgressPolicy
from services.lifecycle import TaskLifecycle
from services.pybench.suite import Suite, load_suite
from services.queues import GRADING_QUEUE, SESSIONS_QUEUE, GradeJob, SessionJob
from services.results.manifest import service_version
from services.store import ArtifactStore
from services.task import Task
from tests.factories import make_submission, make_trajectory
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
    evaluation_id = api.post("/v1/evaluations", json=make_submission(TASKS)).json()["evaluation"]["id"]
    Queue(SESSIONS_QUEUE, connection=redis_client).empty()  # type: ignore[no-untyped-call]  # the sessions "ran"
    store = ArtifactStore(tmp_path)
    lifecycle = TaskLifecycle(redis_client)
    for index, answer in ((44, "Finished: saved"), (134, "Finished: no idea")):
        store.put_trajectory(make_trajectory(evaluation_id, index, answer))
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
    running = api.post("/v1/evaluations", json=make_submission(TASKS)).json()["evaluation"]["id"]
    assert api.post(f"/v1/evaluations/{running}/regrade").status_code == 409

    checks = grading.checks_hash(load_suite(suite_path))
    assert {(v["grader_version"], v["checks_hash"], v["checks_version"]) for v in after["verdicts"]} == {
        (service_version(), checks, grading.CHECKS_VERSION)
    }
    manifest = api.get(f"/v1/evaluations/{evaluation_id}").json()["evaluation"]["manifest"]
    assert [(g["grading"], g["graded"], g["judge_model"]) for g in manifest["gradings"]] == [
        (1, ["checks"], None),
        (2, ["checks", "judge"], "judge-2"),
    ]
    for record in manifest["gradings"]:
        assert record["grader_versions"] == [service_version()] and record["checks_hashes"] == [checks]
        assert record["comparable_key"] == manifest["base_key"] == manifest["comparable_key"]  # the same checks
    assert manifest["gradings"][0]["started_at"] < manifest["gradings"][1]["started_at"]
    assert store.get_evaluation(evaluation_id).model_dump(mode="json")["manifest"] == manifest  # for exports


def test_the_reconciler_queues_a_lost_regrade_again_as_the_regrade_it_was(
    api: TestClient, redis_client: Redis, suite_path: Path, tmp_path: Path
) -> None:
    evaluation_id = api.post("/v1/evaluations", json=make_submission([44])).json()["evaluation"]["id"]
    Queue(SESSIONS_QUEUE, connection=redis_client).empty()  # type: ignore[no-untyped-call]  # the session "ran"
    store = ArtifactStore(tmp_path)
    store.put_trajectory(make_trajectory(evaluation_id, 44, messages=[]))
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


def _finish(api: TestClient, redis: Redis, store: ArtifactStore, tasks: list[int]) -> str:
    """Submit ``tasks`` and end their sessions (no code, an answer in the last message); returns the id."""
    evaluation_id: str = api.post("/v1/evaluations", json=make_submission(tasks)).json()["evaluation"]["id"]
    Queue(SESSIONS_QUEUE, connection=redis).empty()  # type: ignore[no-untyped-call]  # the sessions "ran"
    lifecycle = TaskLifecycle(redis)
    for index in tasks:
        store.put_trajectory(make_trajectory(evaluation_id, index))
        session = SessionJob(evaluation_id=evaluation_id, task_index=index)
        lifecycle.start(session)
        lifecycle.finish_session(session)
    return evaluation_id


def test_a_regrade_with_other_checks_changes_the_comparable_key_and_a_plain_run_keeps_its_own(
    api: TestClient, redis_client: Redis, suite_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ArtifactStore(tmp_path)
    plain, regraded = _finish(api, redis_client, store, TASKS), _finish(api, redis_client, store, TASKS)
    _grade_queued(redis_client, suite_path, store)
    submitted = api.get(f"/v1/evaluations/{plain}").json()["evaluation"]["manifest"]["comparable_key"]
    for evaluation_id in (plain, regraded):  # graded once under the baseline checks: the key as submitted
        manifest = api.get(f"/v1/evaluations/{evaluation_id}").json()["evaluation"]["manifest"]
        assert manifest["comparable_key"] == manifest["base_key"] == submitted
        assert manifest["gradings"][0]["comparable_key"] == submitted
    first_checks = grading.checks_hash(load_suite(suite_path))

    monkeypatch.setattr(grading, "CHECKS_VERSION", 2)  # a grader whose check code changed meaning
    monkeypatch.setattr("grader.jobs.CHECKS_VERSION", 2)
    other_checks = grading.checks_hash(load_suite(suite_path))
    assert other_checks != first_checks
    assert api.post(f"/v1/evaluations/{regraded}/regrade").status_code == 200
    running = api.get(f"/v1/evaluations/{regraded}").json()["evaluation"]["manifest"]
    assert running["gradings"][1]["checks_hashes"] == [] and running["comparable_key"] == submitted  # not done yet
    _grade_queued(redis_client, suite_path, store)

    manifest = api.get(f"/v1/evaluations/{regraded}").json()["evaluation"]["manifest"]
    assert [(g["grading"], g["checks_hashes"]) for g in manifest["gradings"]] == [
        (1, [first_checks]),
        (2, [other_checks]),
    ]
    assert manifest["base_key"] == submitted != manifest["comparable_key"] == manifest["gradings"][1]["comparable_key"]
    assert manifest["gradings"][0]["comparable_key"] == submitted  # what grading 1 gave stays readable
    verdicts = api.get(f"/v1/evaluations/{regraded}/results").json()["verdicts"]
    assert {(v["grading"], v["checks_hash"], v["checks_version"]) for v in verdicts} == {(2, other_checks, 2)}
    earlier = json.loads((store.attempt_dir(regraded, 44, 1) / "verdict-grading-1.json").read_text())
    assert (earlier["checks_hash"], earlier["checks_version"]) == (first_checks, 1)
    assert api.get(f"/v1/evaluations/{plain}").json()["evaluation"]["manifest"]["comparable_key"] == submitted

    board = api.get("/v1/leaderboard").json()
    assert sorted(row["comparable_key"] for row in board) == sorted([submitted, manifest["comparable_key"]])
    refused = api.get("/v1/compare", params={"a": plain, "b": regraded})
    assert refused.status_code == 409 and "different checks" in refused.text


CHECKS_HASHES = {1: "fbb4e611a41f1c2d1a8536dd78e4a4b118e80756556eb799ddc58d608b5d6895"}
"""``grader.grading.checks_hash`` of ``_every_variant`` per check-code version. A pinned hash never changes: a
change to the checks or the gradings' departures that fails here bumps ``CHECKS_VERSION`` and pins its hash."""


def _every_variant() -> Suite:
    """A suite of one task per index the gradings depart at, and one plain task, all with the same check."""
    check = [{"kind": "file_exists", "paths": ["./output/x.png"]}]
    tasks = {
        i: Task(index=i, category1="c", paper_category="Chart", query="q", inputs=[], checks=check)
        for i in sorted({*VARIANTS, 1})
    }
    return Suite("variants", Path("."), tasks)


def test_the_checks_hash_is_pinned_per_check_code_version() -> None:
    assert grading.checks_hash(_every_variant()) == CHECKS_HASHES[grading.CHECKS_VERSION]
