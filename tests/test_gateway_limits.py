"""The gateway's edges, served by a real uvicorn on loopback: a body without a length is cut at the limit, a NUL
byte in a path is a 4xx problem, and /health says when the reconciler is dead."""

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from redis import Redis

from gateway.app import create_app
from gateway.settings import GatewaySettings
from services.live.apikeys import ApiKeyStore
from tests.fixtures import ADMIN_KEY, BODY, gateway_settings
from tests.servers import serve

LIMIT = 64 * 1024


@pytest.fixture()
def settings(redis_url: str, redis_client: Redis, suite_path: Path, tmp_path: Path) -> GatewaySettings:
    return gateway_settings(redis_url, suite_path, tmp_path, MAX_BODY_BYTES=LIMIT)


@pytest.fixture()
def gateway(settings: GatewaySettings) -> Iterator[str]:
    with serve(create_app(settings)) as url:
        yield url


def chunks(total: int, size: int = 16 * 1024) -> Iterator[bytes]:
    sent = 0
    yield b'{"model": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}, "padding": "'
    while sent < total:
        yield b"x" * size
        sent += size
    yield b'"}'


def test_a_chunked_body_past_the_limit_is_refused_413_without_reading_it_whole(gateway: str) -> None:
    with httpx.Client(base_url=gateway, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as client:
        try:
            response = client.post(
                "/v1/evaluations", content=chunks(3 * 1024 * 1024), headers={"content-type": "application/json"}
            )
        except httpx.HTTPError:  # the server may answer and close before the client has sent everything
            pytest.fail("the gateway closed the connection instead of answering 413")
    assert response.status_code == 413, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert str(LIMIT) in response.json()["detail"]
    assert "content-length" not in response.request.headers  # sent chunked: no length declared


def test_a_body_within_the_limit_sent_chunked_is_still_read(gateway: str) -> None:
    body = json.dumps({**BODY, "tasks": [7], "preflight": False}).encode()
    with httpx.Client(base_url=gateway, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as client:
        response = client.post(
            "/v1/evaluations", content=iter([body[:10], body[10:]]), headers={"content-type": "application/json"}
        )
    assert "content-length" not in response.request.headers
    assert response.status_code == 201, response.text


def test_a_nul_byte_in_a_file_name_is_a_4xx_problem(gateway: str) -> None:
    with httpx.Client(base_url=gateway, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as client:
        evaluation_id = client.post("/v1/evaluations", json={**BODY, "tasks": [7]}).json()["evaluation"]["id"]
        response = client.get(f"/v1/evaluations/{evaluation_id}/tasks/7/files/a%00.png")
    assert 400 <= response.status_code < 500, response.text
    assert response.headers["content-type"].startswith("application/problem+json")


def test_health_reports_a_dead_reconciler(settings: GatewaySettings) -> None:
    app = create_app(settings.model_copy(update={"RECONCILE_INTERVAL_S": 3600.0}))
    with TestClient(app) as client:
        started = app.state.reconciler
        assert isinstance(started, threading.Thread) and started.is_alive(), "the gateway started no reconciler"
        alive = client.get("/health")
        assert alive.status_code == 200 and alive.json() == {"status": "ok"}
        dead = threading.Thread(target=lambda: None)
        dead.start()
        dead.join()
        app.state.reconciler = dead
        answer = client.get("/health")
    assert answer.status_code == 503 and answer.json()["reconciler"].startswith("dead")


WORKER_THREADS = 40
"""AnyIO's default thread limit: the synchronous routes of the gateway share these threads."""


def test_rest_event_streams_hold_no_thread_and_are_capped_per_key_and_in_all(
    redis_url: str, redis_client: Redis, suite_path: Path, tmp_path: Path
) -> None:
    per_key, total = WORKER_THREADS + 5, WORKER_THREADS + 15
    settings = gateway_settings(
        redis_url, suite_path, tmp_path, RATE_LIMIT_PER_MINUTE=100_000, MAX_STREAMS_PER_KEY=per_key, MAX_STREAMS=total
    )
    _, other_key = ApiKeyStore(redis_client).create("other")
    body = {**BODY, "tasks": [7], "preflight": False}  # queued, and nothing runs it: its stream stays open

    async def scenario(url: str) -> None:
        limits = httpx.Limits(max_connections=2 * total)
        async with (
            httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, limits=limits) as admin,
            httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {other_key}"}, limits=limits) as other,
        ):
            mine = (await admin.post("/v1/evaluations", json=body)).json()["evaluation"]["id"]
            theirs = (await other.post("/v1/evaluations", json=body)).json()["evaluation"]["id"]
            held: list[tuple[Any, Any]] = []  # each open stream's context and its line reader, kept alive

            async def open_stream(client: httpx.AsyncClient, evaluation_id: str) -> httpx.Response:
                context = client.stream("GET", f"/v1/evaluations/{evaluation_id}/events", timeout=30)
                response = await context.__aenter__()
                if response.status_code == 200:
                    lines = response.aiter_lines()
                    held.append((context, lines))
                    assert await lines.__anext__() == "event: progress"  # the stream is live: its first event came
                else:
                    await response.aread()
                    await context.__aexit__(None, None, None)
                return response

            try:
                opened = await asyncio.gather(*(open_stream(admin, mine) for _ in range(per_key)))
                assert [r.status_code for r in opened] == [200] * per_key
                refused = await open_stream(admin, mine)
                assert refused.status_code == 429 and refused.headers["retry-after"] == "30"
                assert f"may have {per_key}" in refused.json()["detail"]
                others = await asyncio.gather(*(open_stream(other, theirs) for _ in range(total - per_key)))
                assert [r.status_code for r in others] == [200] * (total - per_key)
                full = await open_stream(other, theirs)
                assert full.status_code == 429 and f"{total} event streams open" in full.json()["detail"]
                # More streams open than the server has worker threads: its synchronous routes still answer.
                began = time.monotonic()
                for _ in range(5):
                    assert (await admin.get(f"/v1/evaluations/{mine}", timeout=30)).status_code == 200
                    assert (await admin.get("/health", timeout=30)).status_code == 200
                elapsed = time.monotonic() - began
                assert elapsed < 10, f"ten requests took {elapsed:.1f} s beside {total} open streams"
            finally:
                for context, _ in held:
                    await context.__aexit__(None, None, None)
            deadline = time.monotonic() + 15  # closed streams are counted out: a new one is taken
            while (await open_stream(admin, mine)).status_code != 200:
                assert time.monotonic() < deadline, "closed streams were never counted out"
                await asyncio.sleep(0.2)
            for context, _ in held[-1:]:
                await context.__aexit__(None, None, None)

    with serve(create_app(settings)) as url:
        asyncio.run(scenario(url))
