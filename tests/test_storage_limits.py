"""Storage limits that hold: a key's storage quota refuses its submissions once its evaluations' trajectories and
files reach it, and retention removes old evaluations' trajectories and files (their results and verdicts kept),
after which every read of what went answers 410.

Real components: a real Redis, the gateway app in-process, the artifact store on disk with real files; old
evaluations are made old as a clock would (their creation time in Redis, their results file's time on disk).
"""

import os
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

from gateway import reconcile
from gateway.app import create_app
from gateway.settings import GatewaySettings
from services.lifecycle import TaskLifecycle
from services.live.apikeys import ApiKeyStore
from services.live.retention import MIB, RetentionPolicy, expire_old, storage_used
from services.pybench.suite import load_suite
from services.queues import SESSIONS_QUEUE
from services.results.scores import build_results
from services.state import StateStore
from services.store import EXPIRED_MARKER, ArtifactStore
from services.verdict import VerdictStatus
from tests.factories import make_trajectory, make_verdict
from tests.fixtures import ADMIN_KEY, BODY, gateway_settings, sign_in, wait_for

RUN = (7, 16)
"""The tasks of ``BODY`` that run (13's input is missing: it is unavailable and stores nothing)."""

OLD_DAYS = 100
"""How long ago an "old" evaluation was created and finished: past the default retention of 90 days."""


def _settings(redis_url: str, suite_path: Path, tmp_path: Path, **overrides: object) -> GatewaySettings:
    return gateway_settings(redis_url, suite_path, tmp_path / "artifacts", **overrides)


def _client(settings: GatewaySettings, key: str = ADMIN_KEY) -> TestClient:
    client = TestClient(create_app(settings), follow_redirects=False)
    client.headers["Authorization"] = f"Bearer {key}"
    return client


@pytest.fixture()
def settings(redis_url: str, redis_client: Redis, suite_path: Path, tmp_path: Path) -> GatewaySettings:
    return _settings(redis_url, suite_path, tmp_path)


@pytest.fixture()
def store(settings: GatewaySettings) -> ArtifactStore:
    return ArtifactStore(settings.ARTIFACT_ROOT)


@pytest.fixture()
def api(settings: GatewaySettings) -> Iterator[TestClient]:
    with _client(settings) as client:
        yield client


def _submit(client: TestClient) -> str:
    response = client.post("/v1/evaluations", json=BODY)
    assert response.status_code == 201, response.text
    evaluation_id: str = response.json()["evaluation"]["id"]
    return evaluation_id


def _run_sessions(store: ArtifactStore, evaluation_id: str, file_bytes: int = 1000) -> None:
    """Store what the executor stores for each running task: a trajectory and a produced file of ``file_bytes``."""
    for task in RUN:
        store.put_trajectory(make_trajectory(evaluation_id, task, "Finished: ok", query=f"task {task}"))
        store.put_output_file(evaluation_id, task, 1, f"{task}.csv", b"x" * file_bytes)


def _grade(redis: Redis, store: ArtifactStore, evaluation_id: str) -> None:
    """Record what the grader records: each task's verdict, then the results once the evaluation is complete."""
    lifecycle = TaskLifecycle(redis)
    for task in RUN:
        verdict = make_verdict(evaluation_id, task, VerdictStatus.PASSED, category="Chart analysis")
        store.put_verdict(verdict)
        lifecycle.record_verdict(verdict)
    assert lifecycle.state.complete(evaluation_id)
    store.put_results(build_results(evaluation_id, lifecycle.state.verdicts(evaluation_id), complete=True))


def _days_ago(days: float) -> float:
    return (datetime.now(UTC) - timedelta(days=days)).timestamp()


def _finished(
    client: TestClient, redis: Redis, store: ArtifactStore, *, days_ago: int = 0, finished_days_ago: int | None = None
) -> str:
    """A submitted evaluation whose sessions ran and were graded, created ``days_ago`` days ago and finished
    ``finished_days_ago`` days ago (the same by default)."""
    evaluation_id = _submit(client)
    _run_sessions(store, evaluation_id)
    _grade(redis, store, evaluation_id)
    redis.zadd("pbe:evaluations", {evaluation_id: _days_ago(days_ago)})
    finished = _days_ago(days_ago if finished_days_ago is None else finished_days_ago)
    os.utime(store.evaluation_dir(evaluation_id) / "results.json", (finished, finished))
    return evaluation_id


def _artifacts(store: ArtifactStore, evaluation_id: str) -> list[bool]:
    """For each running task: whether its trajectory and produced files are still stored."""
    return [
        store.has_trajectory(evaluation_id, task, 1) or store.output_dir(evaluation_id, task, 1).exists()
        for task in RUN
    ]


# --- the quota --------------------------------------------------------------------------------------------------


def test_a_key_under_its_quota_may_submit_and_at_its_quota_is_refused_with_what_to_do(
    redis_url: str, redis_client: Redis, suite_path: Path, tmp_path: Path
) -> None:
    settings = _settings(redis_url, suite_path, tmp_path, STORAGE_QUOTA_MB_PER_KEY=1)
    store = ArtifactStore(settings.ARTIFACT_ROOT)
    _, plain = ApiKeyStore(redis_client).create("alice")
    with _client(settings, plain) as alice, _client(settings) as admin:
        first = _submit(alice)
        store.put_output_file(first, 7, 1, "big.bin", b"x" * (MIB - 1))
        second = _submit(alice)  # one byte under the quota: accepted
        store.put_output_file(second, 7, 1, "one.bin", b"x")
        queued = Queue(SESSIONS_QUEUE, connection=redis_client, serializer=JSONSerializer).count

        refused = alice.post("/v1/evaluations", json=BODY)
        assert refused.status_code == 409, refused.text
        assert refused.headers["content-type"] == "application/problem+json"
        problem = refused.json()
        assert problem["usage_bytes"] == MIB and problem["quota_bytes"] == MIB
        assert problem["setting"] == "PBE_STORAGE_QUOTA_MB_PER_KEY"
        detail = problem["detail"]
        assert "take 1.0 MiB" in detail and "quota of 1 MiB (PBE_STORAGE_QUOTA_MB_PER_KEY)" in detail
        assert "delete old evaluations" in detail and "90 days after they finished (PBE_RETENTION_DAYS)" in detail
        assert Queue(SESSIONS_QUEUE, connection=redis_client, serializer=JSONSerializer).count == queued
        assert {e for e, _ in StateStore(redis_client).evaluation_ids(None, limit=10)} == {first, second}

        assert admin.post("/v1/evaluations", json=BODY).status_code == 201  # another key's usage is its own


def test_a_quota_of_zero_is_no_quota(redis_url: str, redis_client: Redis, suite_path: Path, tmp_path: Path) -> None:
    settings = _settings(redis_url, suite_path, tmp_path, STORAGE_QUOTA_MB_PER_KEY=0)
    with _client(settings) as api:
        evaluation_id = _submit(api)
        ArtifactStore(settings.ARTIFACT_ROOT).put_output_file(evaluation_id, 7, 1, "big.bin", b"x" * (2 * MIB))
        assert api.post("/v1/evaluations", json=BODY).status_code == 201


def test_usage_counts_trajectories_and_files_and_a_finished_evaluations_size_is_measured_once(
    api: TestClient, redis_client: Redis, store: ArtifactStore
) -> None:
    evaluation_id = _finished(api, redis_client, store)
    counted = storage_used(redis_client, store, "admin")
    trajectories = sum((store.attempt_dir(evaluation_id, t, 1) / "trajectory.json").stat().st_size for t in RUN)
    assert counted == trajectories + 2 * 1000  # the records (evaluation, results, verdicts) are not counted
    store.put_output_file(evaluation_id, 7, 1, "late.bin", b"x" * 5000)  # only an operator's hand writes now
    assert storage_used(redis_client, store, "admin") == counted  # the finished evaluation's size, from the cache
    TaskLifecycle(redis_client).retry(evaluation_id, 7)  # run again: measured again
    assert storage_used(redis_client, store, "admin") == counted + 5000


def test_retention_frees_a_keys_quota(redis_url: str, redis_client: Redis, suite_path: Path, tmp_path: Path) -> None:
    settings = _settings(redis_url, suite_path, tmp_path, STORAGE_QUOTA_MB_PER_KEY=1)
    store = ArtifactStore(settings.ARTIFACT_ROOT)
    with _client(settings) as api:
        old = _finished(api, redis_client, store, days_ago=OLD_DAYS)
        store.put_output_file(old, 16, 1, "big.bin", b"x" * MIB)
        assert api.post("/v1/evaluations", json=BODY).status_code == 409
        assert expire_old(redis_client, store, RetentionPolicy(days=90)).expired == [old]
        assert api.post("/v1/evaluations", json=BODY).status_code == 201


# --- retention --------------------------------------------------------------------------------------------------


def test_retention_removes_old_trajectories_and_files_keeps_results_and_verdicts_and_spares_recent_ones(
    api: TestClient, redis_client: Redis, store: ArtifactStore
) -> None:
    old = _finished(api, redis_client, store, days_ago=OLD_DAYS)
    recent = _finished(api, redis_client, store, days_ago=OLD_DAYS, finished_days_ago=89)  # a long run
    new = _finished(api, redis_client, store)
    running = _finished(api, redis_client, store, days_ago=OLD_DAYS)
    TaskLifecycle(redis_client).retry(running, 7)  # finished long ago, and running again now: kept
    results_before = api.get(f"/v1/evaluations/{old}/results").json()

    report = expire_old(redis_client, store, RetentionPolicy(days=90))

    assert report.expired == [old] and report.freed_bytes > 2 * 1000
    assert _artifacts(store, old) == [False, False]
    assert _artifacts(store, recent) == _artifacts(store, new) == _artifacts(store, running) == [True, True]
    folder = store.evaluation_dir(old)
    assert (folder / "evaluation.json").is_file() and (folder / "results.json").is_file()
    assert all((store.attempt_dir(old, task, 1) / "verdict.json").is_file() for task in RUN)
    marker = (folder / EXPIRED_MARKER).read_text()
    assert "PBE_RETENTION_DAYS=90" in marker and "more than 90 days ago" in marker
    assert api.get(f"/v1/evaluations/{old}/results").json() == results_before
    assert [t["verdict"]["status"] for t in api.get(f"/v1/evaluations/{old}/tasks").json() if t["verdict"]] == [
        "passed",
        "unavailable",
        "passed",
    ]
    assert api.get(f"/v1/evaluations/{recent}/tasks/7/trajectory").status_code == 200
    assert expire_old(redis_client, store, RetentionPolicy(days=90)).expired == []  # nothing left to remove


def test_reads_of_expired_artifacts_answer_410_saying_when_and_by_which_setting(
    api: TestClient, redis_client: Redis, store: ArtifactStore
) -> None:
    old = _finished(api, redis_client, store, days_ago=OLD_DAYS)
    expire_old(redis_client, store, RetentionPolicy(days=90))
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    base = f"/v1/evaluations/{old}"
    for path in ("/tasks/7/trajectory", "/tasks/7/files", "/tasks/7/files/7.csv", "/tasks/16/files/7.csv", "/archive"):
        response = api.get(base + path)
        assert response.status_code == 410, (path, response.status_code, response.text)
        assert response.headers["content-type"] == "application/problem+json"
        detail = response.json()["detail"]
        assert f"removed on {today}" in detail and "by PBE_RETENTION_DAYS=90" in detail, (path, detail)
        assert f"GET /v1/evaluations/{old}/results" in detail
    assert api.get(f"{base}/tasks/7/trajectory?attempt=2").status_code == 404  # an attempt that never ran


def test_the_dashboards_task_page_and_files_of_an_expired_task_answer_410(
    settings: GatewaySettings, api: TestClient, redis_client: Redis, store: ArtifactStore
) -> None:
    old = _finished(api, redis_client, store, days_ago=OLD_DAYS)
    expire_old(redis_client, store, RetentionPolicy(days=90))
    with TestClient(create_app(settings), base_url="http://testserver", follow_redirects=False) as browser:
        sign_in(browser, ADMIN_KEY)
        for path in ("", "/files/7.csv", "/notebook"):
            page = browser.get(f"/dashboard/evaluations/{old}/tasks/7{path}")
            assert page.status_code == 410, (path, page.status_code)
            assert "PBE_RETENTION_DAYS=90" in page.text, path
        assert browser.get(f"/dashboard/evaluations/{old}").status_code == 200  # the evaluation's page stays


def test_retention_of_zero_days_keeps_everything(api: TestClient, redis_client: Redis, store: ArtifactStore) -> None:
    old = _finished(api, redis_client, store, days_ago=10 * 365)
    assert expire_old(redis_client, store, RetentionPolicy(days=0)).expired == []
    assert _artifacts(store, old) == [True, True]
    assert api.get(f"/v1/evaluations/{old}/tasks/7/trajectory").status_code == 200
    assert api.get(f"/v1/evaluations/{old}/archive").status_code == 200


def test_a_retention_pass_does_bounded_work_and_the_next_pass_goes_on(
    api: TestClient, redis_client: Redis, store: ArtifactStore
) -> None:
    old = [_finished(api, redis_client, store, days_ago=OLD_DAYS + i) for i in range(3)]
    policy = RetentionPolicy(days=90, examined_per_pass=2, expired_per_pass=1)
    passes = [expire_old(redis_client, store, policy) for _ in range(3)]
    assert [p.examined for p in passes] == [1, 1, 1]
    assert sorted(e for p in passes for e in p.expired) == sorted(old)
    assert all(_artifacts(store, evaluation_id) == [False, False] for evaluation_id in old)
    again = expire_old(redis_client, store, RetentionPolicy(days=90, examined_per_pass=2))
    assert again.expired == [] and again.examined == 2  # the cursor went round: it looks from the oldest again


def test_the_reconcilers_loop_runs_the_retention_pass(
    settings: GatewaySettings, api: TestClient, redis_client: Redis, store: ArtifactStore
) -> None:
    old = _finished(api, redis_client, store, days_ago=OLD_DAYS)
    stop = threading.Event()
    suite = load_suite(settings.require_suite(), settings.SUITE_NAME)
    thread = reconcile.run_periodically(redis_client, store, suite, 0.05, stop, RetentionPolicy(days=90))
    try:
        expired = store.evaluation_dir(old) / EXPIRED_MARKER
        wait_for(expired.exists, 20, "the reconciler's loop to expire the old evaluation", interval_s=0.05)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert _artifacts(store, old) == [False, False]
    assert api.get(f"/v1/evaluations/{old}/tasks/16/trajectory").status_code == 410


def test_an_evaluation_run_again_after_expiry_serves_its_new_attempts(
    api: TestClient, redis_client: Redis, store: ArtifactStore
) -> None:
    old = _finished(api, redis_client, store, days_ago=OLD_DAYS)
    expire_old(redis_client, store, RetentionPolicy(days=90))
    lifecycle = TaskLifecycle(redis_client)
    for task in RUN:
        lifecycle.retry(old, task)
        store.put_trajectory(make_trajectory(old, task, None, query=f"again {task}", attempt=2))
    store.put_output_file(old, 7, 2, "7.csv", b"fresh")  # task 16's new attempt saves nothing
    base = f"/v1/evaluations/{old}/tasks"
    assert api.get(f"{base}/7/trajectory").json()["messages"][0]["content"] == "again 7"
    assert api.get(f"{base}/7/files/7.csv").content == b"fresh"
    assert api.get(f"{base}/16/files").json() == []  # nothing saved, nothing removed: not a 410
    assert api.get(f"{base}/7/trajectory?attempt=1").status_code == 410
    archive = api.get(f"/v1/evaluations/{old}/archive")
    assert archive.status_code == 200, archive.text  # the latest attempts are all there
