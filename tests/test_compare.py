"""Paired comparison over REST (``GET /v1/compare``) and the statistics in every results document: values worked
by hand, comparable runs only, completed runs only, another key's runs invisible."""

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from redis import Redis

from gateway.app import create_app
from services.lifecycle import TaskLifecycle
from services.live.apikeys import ApiKeyStore
from services.pybench.suite import load_suite
from services.verdict import VerdictStatus
from tests.factories import make_submission, make_verdict
from tests.fixtures import ADMIN_KEY, gateway_settings, sign_in

TASKS = [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
"""Ten tasks whose inputs are in the suite."""


@pytest.fixture()
def api(redis_url: str, redis_client: Redis, suite_path: Path, tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(gateway_settings(redis_url, suite_path, tmp_path))) as client:
        client.headers["Authorization"] = f"Bearer {ADMIN_KEY}"
        yield client


def _run(api: httpx.Client, redis: Redis, suite_path: Path, passed: set[int], **body: object) -> str:
    """An evaluation of ``TASKS`` whose verdicts pass exactly ``passed`` (the others fail)."""
    submitted = api.post("/v1/evaluations", json=make_submission(TASKS, **body))
    assert submitted.status_code == 201, submitted.text
    evaluation_id = str(submitted.json()["evaluation"]["id"])
    suite = load_suite(suite_path)
    lifecycle = TaskLifecycle(redis)
    for task in TASKS:
        status = VerdictStatus.PASSED if task in passed else VerdictStatus.FAILED
        category = suite.task(task).paper_category
        lifecycle.record_verdict(make_verdict(evaluation_id, task, status, category=category))
    return evaluation_id


def test_two_runs_on_the_same_tasks_are_compared_with_mcnemars_exact_test(
    api: TestClient, redis_client: Redis, suite_path: Path
) -> None:
    # A passes task 2 only; B fails task 2 and passes the nine others: discordant pairs 1 and 9, so the exact
    # two-sided p-value is 2 * (C(10, 0) + C(10, 1)) / 2^10 = 22 / 1024, and B - A = (9 - 1) / 10.
    a = _run(api, redis_client, suite_path, {2})
    b = _run(api, redis_client, suite_path, set(TASKS) - {2})
    answer = api.get("/v1/compare", params={"a": a, "b": b})
    assert answer.status_code == 200, answer.text
    original = answer.json()["gradings"]["original"]["all"]
    assert original["test"] == "mcnemar-exact" and original["discordant"] == [1, 9]
    assert original["p_value"] == pytest.approx(22 / 1024, abs=1e-6) and original["difference"] == pytest.approx(0.8)
    assert original["tasks"] == 10 and original["ci_low"] < 0.8 < original["ci_high"]
    assert "judge" not in answer.json()["gradings"], "neither run was judged"
    same = api.get("/v1/compare", params={"a": a, "b": a})
    assert same.status_code == 409


def test_each_results_document_states_its_rates_with_their_intervals(
    api: TestClient, redis_client: Redis, suite_path: Path
) -> None:
    # 3 of 10 pass: mean 0.3; from the task means (0 or 1):
    # sum (m_i - 0.3)^2 = 3 * 0.49 + 7 * 0.09 = 2.1; SE = sqrt(2.1 / (10 * 9)) = 0.152753.
    evaluation_id = _run(api, redis_client, suite_path, {2, 3, 4})
    statistics = api.get(f"/v1/evaluations/{evaluation_id}/results").json()["statistics"]
    overall = statistics["original"]["all"]
    assert overall["mean"] == pytest.approx(0.3) and overall["standard_error"] == pytest.approx(0.152753, abs=1e-6)
    t_9 = 2.262157
    assert overall["ci_high"] == pytest.approx(0.3 + t_9 * 0.152753, abs=1e-5)
    assert overall["ci_low"] == 0.0, "0.3 - 0.3455 is clipped to a rate"
    assert overall["pass_at_k"] == {"1": pytest.approx(0.3)} and overall["tasks"] == 10
    assert set(statistics["original"]["per_category"]) == {load_suite(suite_path).task(t).paper_category for t in TASKS}


def test_only_completed_comparable_runs_that_the_key_may_see_are_compared(
    api: TestClient, redis_client: Redis, suite_path: Path
) -> None:
    a = _run(api, redis_client, suite_path, {2})
    other_turns = _run(api, redis_client, suite_path, {2}, max_turns=3)
    refused = api.get("/v1/compare", params={"a": a, "b": other_turns})
    assert refused.status_code == 409 and "comparable keys" in refused.json()["detail"]
    running = api.post(
        "/v1/evaluations", json={"model": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}, "tasks": TASKS}
    ).json()["evaluation"]["id"]
    unfinished = api.get("/v1/compare", params={"a": a, "b": running})
    assert unfinished.status_code == 409 and running in unfinished.json()["detail"]
    _, user_key = ApiKeyStore(redis_client, None).create("someone-else")
    hidden = api.get("/v1/compare", params={"a": a, "b": a + "x"}, headers={"Authorization": f"Bearer {user_key}"})
    assert hidden.status_code == 404
    malformed = api.get("/v1/compare", params={"a": a, "b": "x:tasks"})
    assert malformed.status_code == 422


def test_the_leaderboard_gives_each_rate_its_interval_and_marks_who_is_not_separable_from_the_leader(
    api: TestClient, redis_client: Redis, suite_path: Path
) -> None:
    # Leader "a" passes all ten; "b" passes nine (discordant 1 and 0: p = 1, not separable); "c" passes one
    # (discordant 9 and 0: p = 2 / 2^9 = 0.00390625, separable).
    for model, passed in (("a", set(TASKS)), ("b", set(TASKS) - {2}), ("c", {2})):
        _run(api, redis_client, suite_path, passed, model=model)
    board = {row["model"]: row for row in api.get("/v1/leaderboard").json()}
    assert [board[m]["rank"] for m in "abc"] == [1, 2, 3]
    assert board["a"]["p_value_vs_leader"] is None and board["a"]["separable_from_leader"] is None
    assert board["b"]["p_value_vs_leader"] == pytest.approx(1.0) and board["b"]["separable_from_leader"] is False
    assert board["c"]["p_value_vs_leader"] == pytest.approx(2 / 512, abs=1e-6)
    assert board["c"]["separable_from_leader"] is True
    # "b": 9 of 10, SE = sqrt((0.81 + 9 * 0.01) / 90) = 0.1; interval 0.9 -/+ 2.262157 * 0.1, clipped at 1.
    assert board["b"]["best"]["ci_low"] == pytest.approx(0.9 - 0.2262157, abs=1e-5)
    assert board["b"]["best"]["ci_high"] == 1.0


def test_the_dashboards_leaderboard_shows_the_intervals_and_who_is_not_separable(
    redis_url: str, redis_client: Redis, suite_path: Path, tmp_path: Path, api: TestClient
) -> None:
    for model, passed in (("a", set(TASKS)), ("b", set(TASKS) - {2})):
        _run(api, redis_client, suite_path, passed, model=model)
    with TestClient(create_app(gateway_settings(redis_url, suite_path, tmp_path)), follow_redirects=False) as browser:
        sign_in(browser, ADMIN_KEY)
        page = browser.get("/dashboard/leaderboard").text
    assert "67.4%–100.0%" in page  # "b": 0.9 - 2.262157 x 0.1 = 0.674
    assert "<em>not separable</em> (p = 1)" in page
