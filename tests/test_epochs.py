"""Epochs: a submission with ``epochs`` makes one evaluation per epoch (its own sessions, seed and share of the
concurrency), and ``GET /v1/evaluations/{id}/epochs`` states the run's statistics, here against a table worked by
hand."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from redis import Redis
from rq import Queue

from gateway.app import create_app
from services.lifecycle import TaskLifecycle
from services.queues import SESSIONS_QUEUE
from services.results.epochs import epoch_seed
from services.verdict import VerdictStatus
from tests.factories import make_submission, make_verdict
from tests.fixtures import ADMIN_KEY, gateway_settings

TASKS = [2, 3, 4, 5]
P, F, X = VerdictStatus.PASSED, VerdictStatus.FAILED, VerdictStatus.INFRA_ERROR
OUTCOMES = {2: [P, P, P], 3: [P, F, F], 4: [F, F, F], 5: [P, X, F]}
"""Each task's verdict in epochs 1, 2 and 3 (task 5's second epoch broke: left out, counted as excluded)."""


@pytest.fixture()
def api(redis_url: str, redis_client: Redis, suite_path: Path, tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(gateway_settings(redis_url, suite_path, tmp_path))) as client:
        client.headers["Authorization"] = f"Bearer {ADMIN_KEY}"
        yield client


def _submit(api: TestClient, **fields: object) -> dict[str, Any]:
    answer = api.post("/v1/evaluations", json=make_submission(TASKS, **fields))
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


def test_each_epoch_is_an_evaluation_with_its_own_seed_sessions_and_share(api: TestClient, redis_client: Redis) -> None:
    first = _submit(api, epochs=3, max_concurrency=8)["evaluation"]
    assert isinstance(first, dict) and first["run_id"] == first["id"] and first["epochs"] == 3
    run = api.get(f"/v1/evaluations/{first['id']}/epochs").json()
    ids = [epoch["evaluation_id"] for epoch in run["epochs"]]
    assert len(set(ids)) == 3 and ids[0] == first["id"] and [e["epoch"] for e in run["epochs"]] == [1, 2, 3]
    seeds = [epoch["seed"] for epoch in run["epochs"]]
    assert seeds == [epoch_seed(first["id"], e, None) for e in (1, 2, 3)] and len(set(seeds)) == 3
    for evaluation_id in ids:
        evaluation = api.get(f"/v1/evaluations/{evaluation_id}").json()["evaluation"]
        assert evaluation["max_concurrency"] == 2 and evaluation["run_id"] == first["id"]  # 8 // 3
    queued = Queue(SESSIONS_QUEUE, connection=redis_client).job_ids
    for evaluation_id in ids:  # each epoch's own sessions, as many at once as its share admits
        assert sorted(j for j in queued if evaluation_id in j) == [
            f"pbe-session-{evaluation_id}-{t}-a1" for t in (2, 3)
        ]
    again = api.get(f"/v1/evaluations/{ids[2]}/epochs").json()
    assert again["run_id"] == first["id"] and [e["evaluation_id"] for e in again["epochs"]] == ids
    given = _submit(api, epochs=2, sampling={"seed": 41})["evaluation"]
    assert [e["seed"] for e in api.get(f"/v1/evaluations/{given['id']}/epochs").json()["epochs"]] == [41, 42]
    single = _submit(api)["evaluation"]
    assert single["run_id"] is None and single["sampling"].get("seed") is None
    assert api.get(f"/v1/evaluations/{single['id']}/epochs").json()["epochs"][0]["evaluation_id"] == single["id"]
    assert api.post("/v1/evaluations", json={"model": first["model"], "epochs": 11}).status_code == 422


def test_the_runs_statistics_match_the_table_worked_by_hand(api: TestClient, redis_client: Redis) -> None:
    first = _submit(api, epochs=3)["evaluation"]
    assert isinstance(first, dict)
    ids = [e["evaluation_id"] for e in api.get(f"/v1/evaluations/{first['id']}/epochs").json()["epochs"]]
    lifecycle = TaskLifecycle(redis_client)
    for task, statuses in OUTCOMES.items():
        for evaluation_id, status in zip(ids, statuses, strict=True):
            lifecycle.record_verdict(make_verdict(evaluation_id, task, status))
    run = api.get(f"/v1/evaluations/{first['id']}/epochs").json()
    assert run["complete"] is True and all(e["status"] == "completed" for e in run["epochs"])
    overall = run["statistics"]["original"]["all"]
    # Task rates 1, 1/3, 0 and 1/2 (task 5: 1 of its 2 graded epochs): mean 11/24; deviations squared sum to
    # 0.520833, so SE = sqrt(0.520833 / (4 * 3)) = 0.208333.
    assert overall["mean"] == pytest.approx(11 / 24, abs=1e-6)
    assert overall["standard_error"] == pytest.approx(0.208333, abs=1e-6)
    assert (overall["tasks"], overall["samples"], overall["excluded"]) == (4, 11, 1)
    # pass@2: 1, 1 - C(2,2)/C(3,2) = 2/3, 0, 1 - C(1,2)/C(2,2) = 1; pass@3 over the three tasks with 3 samples.
    assert overall["pass_at_k"] == {
        "1": pytest.approx(11 / 24, abs=1e-6),
        "2": pytest.approx(2.6667 / 4, abs=1e-4),
        "3": pytest.approx(2 / 3, abs=1e-6),
    }
    # pass^2: only task 2 passes two of two; pass^3: task 2 of the three tasks with three samples.
    assert overall["pass_hat_k"] == {
        "1": pytest.approx(11 / 24, abs=1e-6),
        "2": pytest.approx(0.25, abs=1e-6),
        "3": pytest.approx(1 / 3, abs=1e-6),
    }
