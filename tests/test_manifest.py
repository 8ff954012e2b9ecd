"""Runs that can be compared: the manifest recorded at submission, the leaderboard that ranks only comparable runs
together, token totals and cost. Real Redis, the gateway app, the suite on disk."""

import hashlib
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from redis import Redis

from gateway.app import create_app
from services.lifecycle import TaskLifecycle
from services.live.components import SANDBOX_IMAGE, advertise, judge_prompt_key
from services.pybench.suite import load_suite
from services.results.manifest import BASELINE_CHECKS_VERSION, graded_key, service_version
from services.verdict import Verdict, VerdictStatus
from tests.factories import make_verdict
from tests.fixtures import ADMIN_KEY, BODY, gateway_settings

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture()
def api(redis_url: str, redis_client: Redis, suite_path: Path, tmp_path: Path) -> Iterator[httpx.Client]:
    with TestClient(create_app(gateway_settings(redis_url, suite_path, tmp_path))) as client:
        client.headers["Authorization"] = f"Bearer {ADMIN_KEY}"
        yield client


def _submit(api: httpx.Client, **extra: Any) -> dict[str, Any]:
    response = api.post("/v1/evaluations", json={**BODY, **extra})
    assert response.status_code == 201, response.text
    evaluation: dict[str, Any] = response.json()["evaluation"]
    return evaluation


def _complete(redis_client: Redis, evaluation: dict[str, Any], passed: set[int], tokens: int = 0) -> None:
    lifecycle = TaskLifecycle(redis_client)
    for task in evaluation["tasks"]:
        if task in evaluation["unavailable_tasks"]:
            continue
        lifecycle.record_verdict(
            Verdict(
                evaluation_id=evaluation["id"],
                task_index=task,
                attempt=1,
                paper_category="Chart",
                status=VerdictStatus.PASSED if task in passed else VerdictStatus.FAILED,
                prompt_tokens=tokens,
                completion_tokens=tokens // 10,
            )
        )


def test_the_manifest_records_what_the_run_ran_with(api: httpx.Client, redis_client: Redis, suite_path: Path) -> None:
    advertise(
        redis_client, {SANDBOX_IMAGE: "pybench-eval/sandbox:latest@sha256:abc", judge_prompt_key("absolute"): "j1"}
    )
    judge = {"endpoint": {"base_url": "http://127.0.0.1:9/v1", "model": "judge-m"}, "mode": "absolute"}
    evaluation = _submit(api, sampling={"temperature": 0.2}, judge=judge, mode="tools")
    manifest = evaluation["manifest"]
    suite = load_suite(suite_path)
    assert manifest["suite_hash"] == suite.content_hash() and len(manifest["suite_hash"]) == 64
    assert manifest["system_prompt_hash"] == hashlib.sha256(suite.system_prompt("gpt").encode()).hexdigest()
    assert manifest["tasks_hash"] == hashlib.sha256(b"7,13,16").hexdigest()
    assert manifest["sampling"]["temperature"] == 0.2 and manifest["mode"] == "tools"
    assert manifest["max_turns"] == 10 and manifest["cell_timeout_s"] == 120.0
    assert manifest["sandbox_image"] == "pybench-eval/sandbox:latest@sha256:abc"
    assert (manifest["judge_model"], manifest["judge_mode"], manifest["judge_prompt_hash"]) == (
        "judge-m",
        "absolute",
        "j1",
    )
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    commit = head.stdout.strip() if head.returncode == 0 else "unknown"  # a tree without .git: unknown
    assert re.fullmatch(r"\d+\.\d+\.\d+\+([0-9a-f]{12}(\.dirty)?|unknown)", manifest["service_version"]), manifest
    assert manifest["service_version"].split("+")[1].startswith(commit)
    assert api.get(f"/v1/evaluations/{evaluation['id']}").json()["evaluation"]["manifest"] == manifest
    assert manifest["base_key"] == manifest["comparable_key"]
    ((first,),) = [manifest["gradings"]]
    assert (first["grading"], first["graded"], first["judge_model"], first["checks_hashes"]) == (
        1,
        ["checks", "judge"],
        "judge-m",
        [],  # filled in from its verdicts when the evaluation completes
    )


def test_comparable_runs_share_a_key_and_others_do_not(api: httpx.Client) -> None:
    keys = {
        "same": _submit(api)["manifest"]["comparable_key"],
        "again": _submit(api, sampling={"temperature": 0.9})["manifest"]["comparable_key"],
        "fewer tasks": _submit(api, tasks=[7])["manifest"]["comparable_key"],
        "other prompt": _submit(api, prompt="llama3")["manifest"]["comparable_key"],
        "other mode": _submit(api, mode="tools")["manifest"]["comparable_key"],
        "fewer turns": _submit(api, max_turns=3)["manifest"]["comparable_key"],
        "a token budget": _submit(api, budgets={"max_tokens_per_task": 5000})["manifest"]["comparable_key"],
        "a time budget": _submit(api, budgets={"max_seconds_per_task": 60})["manifest"]["comparable_key"],
        "no budget named": _submit(api, budgets={})["manifest"]["comparable_key"],
    }
    assert keys["same"] == keys["again"]  # sampling is recorded, but a model's own settings stay comparable
    assert keys["same"] == keys["no budget named"]  # runs without budgets keep the key they always had
    assert len({keys[k] for k in keys if k not in ("again", "no budget named")}) == 7


def test_a_small_run_never_outranks_a_full_one_and_rows_carry_categories_and_cost(
    api: httpx.Client, redis_client: Redis
) -> None:
    prices = {"input_per_million": 2.0, "output_per_million": 10.0}
    full_weak = _submit(api, model={"base_url": "http://127.0.0.1:9/v1", "model": "weak"}, prices=prices)
    full_strong = _submit(api, model={"base_url": "http://127.0.0.1:9/v1", "model": "strong"})
    tiny = _submit(api, tasks=[7], model={"base_url": "http://127.0.0.1:9/v1", "model": "tiny"})
    _complete(redis_client, full_weak, passed=set(), tokens=1_000_000)
    _complete(redis_client, full_strong, passed={7, 16})
    _complete(redis_client, tiny, passed={7})
    board = api.get("/v1/leaderboard").json()
    assert [(r["model"], r["rank"], r["task_count"]) for r in board] == [
        ("strong", 1, 3),
        ("weak", 2, 3),
        ("tiny", 1, 1),
    ]
    assert board[0]["comparable_key"] == board[1]["comparable_key"] != board[2]["comparable_key"]
    weak = board[1]["best"]
    assert weak["prompt_tokens"] == 2_000_000 and weak["completion_tokens"] == 200_000
    assert weak["cost_usd"] == pytest.approx(2 * 2.0 + 0.2 * 10.0)
    assert board[0]["best"]["cost_usd"] is None and board[0]["best"]["per_category"]["Chart"] > 0
    results = api.get(f"/v1/evaluations/{full_weak['id']}/results").json()
    assert results["metrics"]["cost_usd"] == pytest.approx(6.0) and results["metrics"]["prompt_tokens"] == 2_000_000


def test_prices_must_be_whole(api: httpx.Client) -> None:
    response = api.post("/v1/evaluations", json={**BODY, "prices": {"input_per_million": 1}})
    assert response.status_code == 422 and "output_per_million" in response.text


def test_the_service_version_names_the_image_build_where_there_is_one(monkeypatch: pytest.MonkeyPatch) -> None:
    service_version.cache_clear()
    try:
        monkeypatch.setenv("PBE_SERVICE_VERSION", "0.1.0+0123456789ab")
        assert service_version() == "0.1.0+0123456789ab"
        service_version.cache_clear()
        monkeypatch.setenv("PBE_SERVICE_VERSION", "unknown+unknown")  # an image built without the build arguments
        assert service_version().startswith("0.1.0+") and "unknown+unknown" not in service_version()
    finally:
        service_version.cache_clear()


def test_the_key_takes_the_checks_only_when_they_are_not_the_baselines() -> None:
    def graded(status: VerdictStatus, checks: str | None, version: int | None) -> Verdict:
        return make_verdict("e", 1, status, checks_hash=checks, checks_version=version)

    base = "0123456789abcdef"
    assert graded_key(base, []) == base
    assert graded_key(base, [graded(VerdictStatus.PASSED, None, None)]) == base  # graded before checks were recorded
    assert graded_key(base, [graded(VerdictStatus.FAILED, "a", BASELINE_CHECKS_VERSION)]) == base
    assert graded_key(base, [graded(VerdictStatus.INFRA_ERROR, "b", 2)]) == base  # no check decided it
    other = graded_key(base, [graded(VerdictStatus.PASSED, "b", 2)])
    assert other != base and len(other) == 16
    assert graded_key(base, [graded(VerdictStatus.FAILED, "b", 2), graded(VerdictStatus.PASSED, "b", 2)]) == other
    assert graded_key(base, [graded(VerdictStatus.PASSED, "c", 3)]) not in (base, other)
    mixed = graded_key(base, [graded(VerdictStatus.PASSED, "a", 1), graded(VerdictStatus.PASSED, "b", 2)])
    assert mixed not in (base, other)
