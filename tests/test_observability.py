"""Operators can watch it: the gateway's /metrics, the workers' series, JSON log lines that carry the session.

Real components: a real Redis, the gateway app, a real RQ grader worker (it forks its gradings) and the workers'
metrics HTTP server on loopback.
"""

import io
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY
from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

from gateway.app import create_app
from services.errors import ConfigurationError
from services.live.apikeys import ApiKeyStore
from services.live.components import advertised, judge_prompt_key
from services.observability.logs import configure_logging, log_context
from services.observability.monitoring import metrics_address, record_session, serve_worker_metrics
from services.trajectory import EndReason, Execution, Trajectory, Turn
from tests.factories import make_session_info, make_trajectory
from tests.fixtures import ADMIN_KEY, BODY, gateway_settings
from tests.servers import free_port
from tests.workers import GraderWorkerForTests

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture()
def api(redis_url: str, redis_client: Redis, suite_path: Path, tmp_path: Path) -> Iterator[httpx.Client]:
    with TestClient(create_app(gateway_settings(redis_url, suite_path, tmp_path))) as client:
        client.headers["Authorization"] = f"Bearer {ADMIN_KEY}"
        yield client


def _sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one series in Prometheus' text format, or None when it is absent."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        if series == (f"{name}{{{wanted}}}" if labels else name) or (
            labels and series.startswith(name + "{") and _same_labels(series[len(name) + 1 : -1], labels)
        ):
            return float(value)
    return None


def _same_labels(text: str, labels: dict[str, str]) -> bool:
    found = dict(part.split("=", 1) for part in text.split(",") if part)
    return {k: v.strip('"') for k, v in found.items()} == labels


def test_the_gateway_counts_requests_by_route_and_shows_the_fleet_state(api: httpx.Client) -> None:
    evaluation_id = api.post("/v1/evaluations", json=BODY).json()["evaluation"]["id"]
    api.get(f"/v1/evaluations/{evaluation_id}")
    api.get("/v1/evaluations/nosuch")
    api.get("/made/up/path")
    for verb in ("BREW", "PROPFIND", "X-ANYTHING-1"):  # HTTP allows any method token: none grows the labels
        api.request(verb, "/made/up/path")
    response = api.get("/metrics")  # no key needed
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    text = response.text
    route = "/v1/evaluations/{evaluation_id}"
    assert _sample(text, "pbe_http_requests_total", method="GET", route=route, status="200") == 1
    assert _sample(text, "pbe_http_requests_total", method="GET", route=route, status="404") == 1
    assert _sample(text, "pbe_http_requests_total", method="POST", route="/v1/evaluations", status="201") == 1
    assert _sample(text, "pbe_http_requests_total", method="GET", route="unmatched", status="404") == 1
    methods = set(re.findall(r'pbe_http_requests_total\{method="([^"]*)"', text))
    assert methods == {"GET", "POST", "other"}, methods
    assert _sample(text, "pbe_http_request_duration_seconds_count", method="POST", route="/v1/evaluations") == 1
    assert _sample(text, "pbe_evaluations", state="queued") == 1
    assert _sample(text, "pbe_tasks", state="queued") == 2 and _sample(text, "pbe_tasks", state="unavailable") == 1
    assert _sample(text, "pbe_queue_depth", queue="pbe-sessions") == 2
    assert _sample(text, "pbe_sessions_in_flight") == 0
    assert evaluation_id not in text and ADMIN_KEY not in text


def _trajectory(attempt: int, end_reason: EndReason) -> Trajectory:
    return make_trajectory(
        "ev-metrics",
        7,
        None,
        attempt=attempt,
        end_reason=end_reason,
        turns=[
            Turn(
                index=0,
                reply="r",
                code="1",
                execution=Execution(duration_s=0.3),
                prompt_tokens=100,
                completion_tokens=7,
                model_latency_s=1.5,
            ),
            Turn(
                index=1,
                reply="r",
                code="x",
                execution=Execution(duration_s=2.0, timed_out=True),
                prompt_tokens=150,
                completion_tokens=9,
                model_latency_s=0.5,
            ),
        ],
        session=make_session_info(sandbox_id="s", ready_s=3.5, warm=False),
    )


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_an_ended_session_is_counted_and_served_by_the_worker(tmp_path: Path) -> None:
    before = {
        "tokens": _value("pbe_tokens_total", kind="prompt"),
        "timeouts": _value("pbe_cell_duration_seconds_count", outcome="timeout"),
        "infra": _value("pbe_infra_errors_total", cause="sandbox_error"),
        "retries": _value("pbe_session_retries_total"),
        "cold": _value("pbe_sandbox_start_seconds_count", warm="false"),
        "model": _value("pbe_model_latency_seconds_sum"),
    }
    record_session(_trajectory(1, EndReason.NO_CODE))
    record_session(_trajectory(2, EndReason.SANDBOX_ERROR))
    assert _value("pbe_tokens_total", kind="prompt") - before["tokens"] == 500
    assert _value("pbe_cell_duration_seconds_count", outcome="timeout") - before["timeouts"] == 2
    assert _value("pbe_infra_errors_total", cause="sandbox_error") - before["infra"] == 1
    assert _value("pbe_session_retries_total") - before["retries"] == 1
    assert _value("pbe_sandbox_start_seconds_count", warm="false") - before["cold"] == 2
    assert _value("pbe_model_latency_seconds_sum") - before["model"] == pytest.approx(4.0)
    port = free_port()
    assert serve_worker_metrics(port, host="127.0.0.1")
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    assert (_sample(text, "pbe_sessions_total", end_reason="sandbox_error") or 0) >= 1
    assert not serve_worker_metrics(port, host="127.0.0.1")  # taken: logged, the worker goes on


def grade_for_test(status: str) -> dict[str, Any]:
    """A grading job for the worker test: returns what ``grader.jobs.grade_session`` returns."""
    return {"task": 7, "status": status}


def test_the_grader_counts_gradings_in_the_parent_and_advertises_the_judge_prompts(
    redis_client: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PBE_METRICS_PORT", "0")
    queue = Queue("pbe-grading-test", connection=redis_client, serializer=JSONSerializer)
    passed, errors = _value("pbe_gradings_total", status="passed"), _value("pbe_gradings_total", status="error")
    count = _value("pbe_grading_seconds_count")
    queue.enqueue("tests.test_observability.grade_for_test", "passed")
    queue.enqueue("tests.test_observability.no_such_function")  # the child fails: counted as an error
    worker = GraderWorkerForTests([queue], connection=redis_client, serializer=JSONSerializer)
    worker.work(burst=True)
    assert _value("pbe_gradings_total", status="passed") - passed == 1
    assert _value("pbe_gradings_total", status="error") - errors == 1
    assert _value("pbe_grading_seconds_count") - count == 2
    hashes = advertised(redis_client)
    assert len(hashes[judge_prompt_key("absolute")]) == 64 and len(hashes[judge_prompt_key("pairwise")]) == 64


def test_json_log_lines_carry_the_session_they_were_written_for() -> None:
    handler = configure_logging("json")
    stream = io.StringIO()
    handler.setStream(stream)
    try:
        log = logging.getLogger("executor.test")
        with log_context(evaluation="ev1", task=7), log_context(attempt=2):
            log.info("cell %d ran", 3)
        log.warning("outside")
    finally:
        logging.getLogger().removeHandler(handler)
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["message"] == "cell 3 ran" and first["level"] == "info" and first["logger"] == "executor.test"
    assert (first["evaluation"], first["task"], first["attempt"]) == ("ev1", 7, 2)
    assert "evaluation" not in second and second["level"] == "warning"


def test_text_log_lines_mark_the_session_too() -> None:
    handler = configure_logging("text")
    stream = io.StringIO()
    handler.setStream(stream)
    try:
        with log_context(evaluation="ev9", task=3, attempt=1):
            logging.getLogger("grader.test").info("graded")
    finally:
        logging.getLogger().removeHandler(handler)
    assert stream.getvalue().rstrip().endswith("graded [evaluation=ev9 task=3 attempt=1]")


def test_worker_metrics_listen_on_the_route_to_redis_or_the_address_given(redis_url: str) -> None:
    """``route-to:redis`` is this host's address towards Redis (here loopback, as Redis is); an IP address is
    taken as it is; anything else is refused with what to set."""
    assert metrics_address("route-to:redis", redis_url) == "127.0.0.1"
    assert metrics_address("route-to:redis", "redis://:pw@localhost:6379/0") in ("127.0.0.1", "::1")
    assert metrics_address("127.0.0.2", redis_url) == "127.0.0.2"
    for bad in ("eth0", "0.0.0.0.0", ""):
        with pytest.raises(ConfigurationError, match="PBE_METRICS_HOST"):
            metrics_address(bad, redis_url)
    with pytest.raises(ConfigurationError, match="route to Redis"):
        metrics_address("route-to:redis", "redis://no-such-host.invalid:6379/0")


def test_an_operator_reads_a_workers_metrics_where_it_serves_them(redis_url: str) -> None:
    port = free_port()
    assert serve_worker_metrics(port, metrics_address("route-to:redis", redis_url))
    env = {**os.environ, "PBE_METRICS_PORT": str(port), "PBE_REDIS_URL": redis_url}
    done = subprocess.run(
        [sys.executable, "-m", "services.observability.monitoring"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "pbe_sessions_total" in done.stdout


def test_metrics_access_open_admin_or_off(
    redis_url: str, redis_client: Redis, suite_path: Path, tmp_path: Path
) -> None:
    """``PBE_METRICS_ACCESS`` says who reads the gateway's series: anyone, an admin key only, or nobody."""
    for access, anonymous, user, admin in (("open", 200, 200, 200), ("admin", 401, 401, 200), ("off", 404, 404, 404)):
        settings = gateway_settings(redis_url, suite_path, tmp_path, METRICS_ACCESS=access)
        with TestClient(create_app(settings)) as client:
            _, user_key = ApiKeyStore(redis_client, None).create("metrics-reader")
            answers = [
                client.get("/metrics", headers=headers).status_code
                for headers in ({}, {"Authorization": f"Bearer {user_key}"}, {"Authorization": f"Bearer {ADMIN_KEY}"})
            ]
            assert answers == [anonymous, user, admin], access
            if admin == 200:
                read = client.get("/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
                assert "pbe_http_requests_total" in read.text
