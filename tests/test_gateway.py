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
from services.lifecycle import TaskLifecycle
from services.live.apikeys import ApiKeyStore
from services.queues import SESSIONS_QUEUE
from services.state import StateStore
from services.store import ArtifactStore
from services.verdict import VerdictStatus
from tests.factories import make_verdict
from tests.fixtures import ADMIN_KEY, BODY, gateway_settings, test_secrets

CANARY_KEY = "sk-canary-4f1d2a9e7b"
JUDGE_CANARY_KEY = "sk-judge-canary-8c2e"


@pytest.fixture()
def app_settings(redis_url: str, redis_client: Redis, suite_path: Path, tmp_path: Path) -> GatewaySettings:
    return gateway_settings(redis_url, suite_path, tmp_path)


@pytest.fixture()
def anonymous(app_settings: GatewaySettings) -> Iterator[httpx.Client]:
    with TestClient(create_app(app_settings)) as client:
        yield client


@pytest.fixture()
def api(anonymous: httpx.Client) -> httpx.Client:
    """The admin's client."""
    anonymous.headers["Authorization"] = f"Bearer {ADMIN_KEY}"
    return anonymous


def user_client(settings: GatewaySettings, redis_client: Redis, name: str) -> TestClient:
    _, plain = ApiKeyStore(redis_client).create(name)
    client = TestClient(create_app(settings))
    client.headers["Authorization"] = f"Bearer {plain}"
    return client


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
    assert view["progress"]["counts"] == {
        "queued": 2,
        "running": 0,
        "grading": 0,
        "done": 0,
        "unavailable": 1,
        "cancelled": 0,
    }
    assert view["evaluation"]["owner"] == "admin"
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


def test_every_v1_route_needs_a_valid_key(anonymous: httpx.Client, redis_client: Redis) -> None:
    for method, path in (("GET", "/v1/evaluations"), ("POST", "/v1/evaluations"), ("GET", "/v1/suites")):
        response = anonymous.request(method, path, json=BODY if method == "POST" else None)
        assert response.status_code == 401 and response.headers["www-authenticate"].startswith("Bearer")
        assert "gateway.keys create" in response.json()["detail"]
    anonymous.headers["Authorization"] = "Bearer pbe_000000000000_" + "x" * 43
    assert anonymous.get("/v1/evaluations").status_code == 401
    key, plain = ApiKeyStore(redis_client).create("carol")
    anonymous.headers["Authorization"] = f"Bearer {plain}"
    assert anonymous.get("/v1/evaluations").status_code == 200
    ApiKeyStore(redis_client).revoke(key.id)
    assert anonymous.get("/v1/evaluations").status_code == 401
    assert anonymous.get("/health").status_code == 200  # health needs no key
    stored = redis_client.hgetall(f"pbe:apikey:{key.id}")
    assert plain.encode() not in b"".join(stored.values()) and plain.split("_")[-1].encode() not in b"".join(
        stored.values()
    )


def test_a_key_sees_only_its_own_evaluations_and_an_admin_sees_all(
    app_settings: GatewaySettings, api: httpx.Client, redis_client: Redis, tmp_path: Path
) -> None:
    with (
        user_client(app_settings, redis_client, "alice") as alice,
        user_client(app_settings, redis_client, "bob") as bob,
    ):
        mine = alice.post("/v1/evaluations", json=BODY).json()["evaluation"]["id"]
        store = ArtifactStore(tmp_path)
        store.put_output_file(mine, 7, 1, "secret.csv", b"alice's data")
        for path in ("", "/results", "/tasks", "/tasks/7/files", "/tasks/7/files/secret.csv", "/events"):
            response = bob.get(f"/v1/evaluations/{mine}{path}")
            assert response.status_code == 404, path
            assert response.json()["detail"] == f"no evaluation {mine!r}; list yours with GET /v1/evaluations"
        assert bob.post(f"/v1/evaluations/{mine}/cancel").status_code == 404
        assert bob.get("/v1/evaluations").json()["items"] == []
        assert [v["evaluation"]["id"] for v in alice.get("/v1/evaluations").json()["items"]] == [mine]
        assert alice.get(f"/v1/evaluations/{mine}/tasks/7/files").json() == ["./output/secret.csv"]
        assert alice.get(f"/v1/evaluations/{mine}/tasks/7/files/secret.csv").content == b"alice's data"
        assert alice.get(f"/v1/evaluations/{mine}/tasks/7/files/..%2F..%2Fevaluation.json").status_code == 404
        theirs = bob.post("/v1/evaluations", json=BODY).json()["evaluation"]["id"]
    listed = {v["evaluation"]["id"] for v in api.get("/v1/evaluations").json()["items"]}
    assert listed == {mine, theirs}


def test_evaluations_are_listed_a_page_at_a_time_with_filters(api: httpx.Client) -> None:
    made = [api.post("/v1/evaluations", json={**BODY, "tasks": [7]}).json()["evaluation"]["id"] for _ in range(5)]
    other = {**BODY, "model": {"base_url": "http://127.0.0.1:9/v1", "model": "other"}, "tasks": [7]}
    odd = api.post("/v1/evaluations", json=other).json()["evaluation"]["id"]
    first = api.get("/v1/evaluations", params={"limit": 4}).json()
    second = api.get("/v1/evaluations", params={"limit": 4, "cursor": first["next_cursor"]}).json()
    ids = [v["evaluation"]["id"] for v in first["items"] + second["items"]]
    assert ids == [odd, *reversed(made)] and second["next_cursor"] is None
    only = api.get("/v1/evaluations", params={"model": "other"}).json()["items"]
    assert [v["evaluation"]["id"] for v in only] == [odd]
    assert api.get("/v1/evaluations", params={"status": "completed"}).json()["items"] == []
    assert api.get("/v1/evaluations", params={"limit": 0}).status_code == 422


def test_a_repeated_post_with_an_idempotency_key_returns_the_same_evaluation(
    api: httpx.Client, redis_client: Redis
) -> None:
    headers = {"Idempotency-Key": "retry-after-timeout-1"}
    first = api.post("/v1/evaluations", json=BODY, headers=headers)
    again = api.post("/v1/evaluations", json=BODY, headers=headers)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["evaluation"]["id"] == again.json()["evaluation"]["id"]
    assert Queue(SESSIONS_QUEUE, connection=redis_client, serializer=JSONSerializer).count == 2  # not 4
    other = api.post("/v1/evaluations", json={**BODY, "tasks": [7]}, headers=headers)
    assert other.status_code == 409 and "another body" in other.json()["detail"]
    fresh = api.post("/v1/evaluations", json=BODY, headers={"Idempotency-Key": "another"})
    assert fresh.status_code == 201 and fresh.json()["evaluation"]["id"] != first.json()["evaluation"]["id"]


def test_keys_lost_with_redis_can_be_sent_again_and_are_never_shown(
    api: httpx.Client, app_settings: GatewaySettings, redis_client: Redis
) -> None:
    keyed = api.post("/v1/evaluations", json={**BODY, "api_key": CANARY_KEY}).json()["evaluation"]["id"]
    redis_client.delete(f"pbe:secret:model-key:{keyed}")  # as after a Redis restart without persistence
    sent = api.put(f"/v1/evaluations/{keyed}/keys", json={"api_key": CANARY_KEY})
    assert sent.status_code == 200 and CANARY_KEY not in sent.text
    assert StateStore(redis_client, test_secrets()).model_key(keyed) == CANARY_KEY
    assert 0 < redis_client.ttl(f"pbe:secret:model-key:{keyed}") <= 14 * 24 * 3600

    assert api.put(f"/v1/evaluations/{keyed}/keys", json={}).status_code == 422
    judge = api.put(f"/v1/evaluations/{keyed}/keys", json={"judge_api_key": JUDGE_CANARY_KEY})
    assert judge.status_code == 409 and "without a judge API key" in judge.json()["detail"]
    keyless = api.post("/v1/evaluations", json=BODY).json()["evaluation"]["id"]
    refused = api.put(f"/v1/evaluations/{keyless}/keys", json={"api_key": CANARY_KEY})
    assert refused.status_code == 409 and StateStore(redis_client, test_secrets()).model_key(keyless) is None
    with user_client(app_settings, redis_client, "mallory") as other:
        assert other.put(f"/v1/evaluations/{keyed}/keys", json={"api_key": "sk-mallory"}).status_code == 404
    assert StateStore(redis_client, test_secrets()).model_key(keyed) == CANARY_KEY


def test_an_id_that_names_another_key_of_an_evaluation_is_a_404_not_a_server_error(api: httpx.Client) -> None:
    evaluation_id = api.post("/v1/evaluations", json=BODY).json()["evaluation"]["id"]
    for suffix in (":tasks", ":verdicts", ":attempts", ":tasks:x"):
        response = api.get(f"/v1/evaluations/{evaluation_id}{suffix}")
        assert response.status_code == 404, (suffix, response.status_code, response.text)
        assert "ids are letters, digits" in response.json()["detail"]
        assert api.get(f"/v1/evaluations/{evaluation_id}{suffix}/results").status_code == 404
    assert api.get(f"/v1/evaluations/{evaluation_id}").status_code == 200


def test_a_missing_artifact_is_a_404_that_shows_no_server_path(api: httpx.Client, tmp_path: Path) -> None:
    evaluation_id = api.post("/v1/evaluations", json=BODY).json()["evaluation"]["id"]  # queued: no trajectory yet
    missing = api.get(f"/v1/evaluations/{evaluation_id}/tasks/7/trajectory")
    assert missing.status_code == 404
    detail = missing.json()["detail"]
    assert f"evaluations/{evaluation_id}/tasks/7/attempt-1/trajectory.json" in detail
    assert str(tmp_path) not in missing.text and str(tmp_path.resolve()) not in missing.text


def test_a_finished_evaluations_keys_are_never_stored_again_but_travel_with_a_retry(
    api: httpx.Client, redis_client: Redis
) -> None:
    keyed = api.post("/v1/evaluations", json={**BODY, "api_key": CANARY_KEY}).json()["evaluation"]["id"]
    lifecycle, state = TaskLifecycle(redis_client, test_secrets()), StateStore(redis_client, test_secrets())
    for index in (7, 16):
        lifecycle.record_verdict(make_verdict(keyed, index, VerdictStatus.FAILED))
    assert state.complete(keyed) and state.model_key(keyed) is None  # dropped once every task finished
    stored = api.put(f"/v1/evaluations/{keyed}/keys", json={"api_key": CANARY_KEY})
    assert stored.status_code == 409 and "retry" in stored.json()["detail"] and state.model_key(keyed) is None
    keyless = api.post(f"/v1/evaluations/{keyed}/retry")
    assert keyless.status_code == 409 and "api_key" in keyless.json()["detail"]
    assert state.task_attempt(keyed, 7) == 1  # nothing ran again without its key
    retried = api.post(f"/v1/evaluations/{keyed}/retry", json={"tasks": [7], "api_key": CANARY_KEY})
    assert retried.status_code == 200 and CANARY_KEY not in retried.text
    assert state.model_key(keyed) == CANARY_KEY and state.task_attempt(keyed, 7) == 2
    assert 0 < redis_client.ttl(f"pbe:secret:model-key:{keyed}") <= 14 * 24 * 3600


def test_cancelling_removes_the_queued_sessions_and_retry_reruns_failed_tasks(
    api: httpx.Client, redis_client: Redis
) -> None:
    evaluation_id = api.post("/v1/evaluations", json=BODY).json()["evaluation"]["id"]
    queue = Queue(SESSIONS_QUEUE, connection=redis_client, serializer=JSONSerializer)
    assert queue.count == 2
    view = api.post(f"/v1/evaluations/{evaluation_id}/cancel").json()
    assert view["status"] == "cancelled" and view["progress"]["counts"]["cancelled"] == 2
    assert queue.count == 0
    assert api.post(f"/v1/evaluations/{evaluation_id}/retry").status_code == 409
    # A task that failed runs again as its next attempt.
    second = api.post("/v1/evaluations", json=BODY).json()["evaluation"]["id"]
    state = StateStore(redis_client)
    TaskLifecycle(redis_client).record_verdict(make_verdict(second, 7, VerdictStatus.INFRA_ERROR))
    refused = api.post(f"/v1/evaluations/{second}/retry", json={"tasks": [16]})
    assert refused.status_code == 409 and "[7]" in refused.json()["detail"]
    retried = api.post(f"/v1/evaluations/{second}/retry").json()
    assert retried["progress"]["counts"]["queued"] == 2 and state.task_attempt(second, 7) == 2
    assert f"pbe-session-{second}-7-a2" in queue.job_ids


def test_past_its_rate_a_key_gets_429_with_retry_after(
    redis_url: str, redis_client: Redis, suite_path: Path, tmp_path: Path
) -> None:
    settings = gateway_settings(redis_url, suite_path, tmp_path, RATE_LIMIT_PER_MINUTE=3)
    with user_client(settings, redis_client, "eager") as eager, user_client(settings, redis_client, "calm") as calm:
        statuses = [eager.get("/v1/evaluations").status_code for _ in range(4)]
        assert statuses == [200, 200, 200, 429]
        limited = eager.get("/v1/evaluations")
        assert 1 <= int(limited.headers["retry-after"]) <= 61 and "3 requests a minute" in limited.json()["detail"]
        assert calm.get("/v1/evaluations").status_code == 200  # the limit is per key


def test_sessions_in_flight_per_key_and_the_global_queue_are_capped(
    redis_url: str, redis_client: Redis, suite_path: Path, tmp_path: Path
) -> None:
    settings = gateway_settings(redis_url, suite_path, tmp_path, MAX_SESSIONS_PER_KEY=3)
    with user_client(settings, redis_client, "busy") as busy:
        assert busy.post("/v1/evaluations", json=BODY).status_code == 201  # 2 sessions
        capped = busy.post("/v1/evaluations", json=BODY)
        assert capped.status_code == 429 and "2 task sessions" in capped.json()["detail"]
    full = gateway_settings(redis_url, suite_path, tmp_path, MAX_QUEUED_SESSIONS=3)
    with user_client(full, redis_client, "late") as late:
        refused = late.post("/v1/evaluations", json=BODY)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "120"


@pytest.mark.parametrize(
    ("base_url", "status"),
    [
        ("http://169.254.169.254/latest/meta-data", 403),  # cloud metadata
        ("http://10.0.0.7:8000/v1", 403),
        ("http://127.0.0.2:8000/v1", 403),  # loopback, not the allowed 127.0.0.1
        ("http://0x7f000001/v1", 403),  # 127.0.0.1 in disguise
        ("http://2130706433/v1", 403),
        ("http://localhost:8000/v1", 403),
        ("http://[::1]:8000/v1", 403),  # IPv6 loopback: not the allowed 127.0.0.1
        ("http://[::ffff:10.0.0.7]:8000/v1", 403),  # an IPv4-mapped internal address
        ("http://[fd00::7]/v1", 403),  # a unique-local (private) IPv6 address
        ("http://[::1%25lo]:8000/v1", 422),  # no zone ids
        ("http://user:pw@127.0.0.1:8000/v1", 422),  # no credentials in URLs
    ],
)
def test_internal_endpoints_are_refused_at_submission(
    api: httpx.Client, redis_client: Redis, base_url: str, status: int
) -> None:
    response = api.post("/v1/evaluations", json={**BODY, "model": {"base_url": base_url, "model": "m"}})
    assert response.status_code == status, response.text
    assert "model.base_url" in response.json()["detail"]
    assert Queue(SESSIONS_QUEUE, connection=redis_client, serializer=JSONSerializer).count == 0
    judge = {"endpoint": {"base_url": base_url, "model": "j"}}
    refused = api.post("/v1/evaluations", json={**BODY, "judge": judge})
    assert refused.status_code == status and "judge.endpoint.base_url" in refused.json()["detail"]
    if status == 403:
        assert any(hint in refused.json()["detail"] for hint in ("PBE_EGRESS_ALLOWLIST", "four decimal numbers"))


def test_the_leaderboard_ranks_completed_evaluations_per_model(api: httpx.Client, redis_client: Redis) -> None:
    made = []
    for passed in (True, False):
        evaluation_id = api.post("/v1/evaluations", json={**BODY, "tasks": [7]}).json()["evaluation"]["id"]
        status = VerdictStatus.PASSED if passed else VerdictStatus.FAILED
        TaskLifecycle(redis_client).record_verdict(make_verdict(evaluation_id, 7, status))
        made.append(evaluation_id)
    api.post("/v1/evaluations", json={**BODY, "tasks": [7]})  # still queued: not on the board
    (row,) = api.get("/v1/leaderboard").json()
    assert row["model"] == "m" and row["evaluations"] == 2
    assert row["best"]["evaluation_id"] == made[0] and row["best"]["pass_rate"] == 1.0
    assert row["latest"]["evaluation_id"] == made[1]


def test_progress_streams_as_server_sent_events_until_the_end(api: httpx.Client, redis_client: Redis) -> None:
    evaluation_id = api.post("/v1/evaluations", json={**BODY, "tasks": [7]}).json()["evaluation"]["id"]
    TaskLifecycle(redis_client).record_verdict(make_verdict(evaluation_id, 7, VerdictStatus.PASSED))
    with api.stream("GET", f"/v1/evaluations/{evaluation_id}/events") as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        text = "".join(response.iter_text())
    names = [line.removeprefix("event: ") for line in text.splitlines() if line.startswith("event: ")]
    assert names == ["progress", "verdict", "end"]
    assert '"status": "completed"' in text
