"""The gateway's REST API, in-process (ASGI transport) against a real Redis."""

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

from gateway.app import create_app
from gateway.settings import GatewaySettings
from services.queues import SESSIONS_QUEUE

CANARY_KEY = "sk-canary-4f1d2a9e7b"
JUDGE_CANARY_KEY = "sk-judge-canary-8c2e"
BODY = {"model": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}, "tasks": [7, 13, 16], "prompt": "gpt"}


@pytest.fixture()
def api(redis_url: str, redis_client: Redis, suite_path: Path, tmp_path: Path) -> Iterator[httpx.Client]:
    settings = GatewaySettings(REDIS_URL=redis_url, SUITE_PATH=suite_path, ARTIFACT_ROOT=tmp_path)
    with TestClient(create_app(settings)) as client:
        yield client


def test_submission_is_stored_and_one_session_per_available_task_is_enqueued(
    api: httpx.Client, redis_client: Redis, tmp_path: Path
) -> None:
    judge = {"endpoint": {"base_url": "http://127.0.0.1:9/v1", "model": "judge"}, "mode": "pairwise"}
    body = {**BODY, "api_key": CANARY_KEY, "judge": judge, "judge_api_key": JUDGE_CANARY_KEY}
    response = api.post("/v1/evaluations", json=body)
    assert response.status_code == 201, response.text
    view = response.json()
    evaluation_id = view["evaluation"]["id"]
    assert view["evaluation"]["unavailable_tasks"] == [13]
    assert view["evaluation"]["has_api_key"] is True and view["evaluation"]["has_judge_api_key"] is True
    assert view["evaluation"]["judge"] == judge
    assert view["progress"]["counts"] == {"queued": 2, "running": 0, "grading": 0, "done": 0, "unavailable": 1}
    assert (tmp_path / "evaluations" / evaluation_id / "evaluation.json").is_file()
    queue = Queue(SESSIONS_QUEUE, connection=redis_client, serializer=JSONSerializer)
    assert queue.job_ids == [f"pbe-session-{evaluation_id}-7-a1", f"pbe-session-{evaluation_id}-16-a1"]
    assert sorted(job.args[0]["task_index"] for job in queue.jobs) == [7, 16]
    assert all(set(job.args[0]) == {"evaluation_id", "task_index", "attempt"} for job in queue.jobs)
    # The keys are kept for the executor and the grader but never shown, stored with the evaluation, or put
    # in a job.
    for canary in (CANARY_KEY, JUDGE_CANARY_KEY):
        assert canary not in response.text
        assert canary not in api.get(f"/v1/evaluations/{evaluation_id}").text
        assert canary not in (tmp_path / "evaluations" / evaluation_id / "evaluation.json").read_text()
        for job in queue.jobs:
            assert canary.encode() not in (redis_client.hget(f"rq:job:{job.id}", "data") or b"")
        assert canary.encode() not in redis_client.get(f"pbe:evaluation:{evaluation_id}")

    status = api.get(f"/v1/evaluations/{evaluation_id}").json()
    assert status["status"] == "queued" and status["progress"]["total"] == 3
    results = api.get(f"/v1/evaluations/{evaluation_id}/results").json()
    assert results["complete"] is False
    assert [(v["task_index"], v["status"]) for v in results["verdicts"]] == [(13, "unavailable")]
    assert results["metrics"]["tasks"] == 1


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({**BODY, "tasks": [7, 100000]}, 422, "100000"),
        ({**BODY, "tasks": []}, 422, "at least one task"),
        ({**BODY, "prompt": "nosuchprompt"}, 422, "gpt"),
        ({**BODY, "suite": "other"}, 422, "pybench"),
        ({**BODY, "model": {"base_url": "ftp://x", "model": "m"}}, 422, "http"),
        ({**BODY, "max_turns": 0}, 422, "max_turns"),
        ({**BODY, "unexpected": 1}, 422, "unexpected"),
    ],
)
def test_bad_submissions_are_refused_with_a_problem_that_says_what_to_do(
    api: httpx.Client, redis_client: Redis, body: dict[str, object], status: int, needle: str
) -> None:
    response = api.post("/v1/evaluations", json=body)
    assert response.status_code == status
    assert response.headers["content-type"] == "application/problem+json"
    assert needle in response.json()["detail"]
    assert Queue(SESSIONS_QUEUE, connection=redis_client, serializer=JSONSerializer).count == 0


def test_malformed_json_and_unknown_resources(api: httpx.Client) -> None:
    response = api.post("/v1/evaluations", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 422 and response.headers["content-type"] == "application/problem+json"
    missing = api.get("/v1/evaluations/nosuch")
    assert missing.status_code == 404 and "GET /v1/evaluations" in missing.json()["detail"]
    assert api.get("/v1/evaluations/nosuch/results").status_code == 404
    assert api.get("/no/such/path").status_code == 404


def test_oversized_body_is_refused(api: httpx.Client) -> None:
    response = api.post(
        "/v1/evaluations", content=b"x" * (2 * 1024 * 1024), headers={"content-type": "application/json"}
    )
    assert response.status_code == 413


def test_suites_list_the_unavailable_tasks(api: httpx.Client) -> None:
    (suite,) = api.get("/v1/suites").json()
    assert suite["name"] == "pybench" and suite["tasks"] == 143
    assert suite["unavailable_tasks"] == [13, 17, 23, 25, 34, 42, 54, 55, 56, 66, 142]
    tasks = api.get("/v1/suites/pybench/tasks").json()
    assert len(tasks) == 143
    assert api.get("/v1/suites/other/tasks").status_code == 404


def test_health_answers(api: httpx.Client) -> None:
    assert api.get("/health").json() == {"status": "ok"}
