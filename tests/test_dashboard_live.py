"""The dashboard's live progress over a real uvicorn server and a real Redis: the evaluation page's stream and the
runs list's one stream for all its running evaluations send progress as tasks finish and end with the evaluation;
streams are checked against the key's rights; and open streams (more of them than the server has worker threads)
leave the gateway answering."""

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis import Redis

from gateway.app import create_app
from services.live.apikeys import ApiKeyStore
from services.store import ArtifactStore
from services.verdict import VerdictStatus
from tests import dashboard_data as data
from tests.fixtures import ADMIN_KEY, gateway_settings
from tests.servers import serve

WORKER_THREADS = 40
"""AnyIO's default thread limit: the synchronous routes of the gateway share these threads."""


@pytest.fixture()
def store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(tmp_path)


@pytest.fixture()
def gateway(redis_url: str, redis_client: Redis, suite_path: Path, tmp_path: Path) -> Iterator[str]:
    settings = gateway_settings(redis_url, suite_path, tmp_path, RATE_LIMIT_PER_MINUTE=100_000, MAX_STREAMS_PER_KEY=100)
    with serve(create_app(settings)) as url:
        yield url


@pytest.fixture()
def api(gateway: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as client:
        yield client


def signed_in(gateway: str, key: str) -> dict[str, str]:
    """The session cookie of a sign-in with ``key`` through the sign-in form."""
    with httpx.Client(base_url=gateway) as browser:
        form = browser.get("/dashboard/login")
        found = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert found is not None
        done = browser.post("/dashboard/login", data={"key": key, "csrf": found.group(1), "next": "/dashboard/runs"})
        assert done.status_code == 303
        return {name: value for name, value in browser.cookies.items() if name == "pbe_dashboard"}


def events(lines: Iterator[str], until: str, timeout_s: float = 15) -> list[tuple[str, dict[str, Any]]]:
    """The server-sent events read from ``lines`` up to and including the first named ``until``."""
    found: list[tuple[str, dict[str, Any]]] = []
    name = ""
    deadline = time.monotonic() + timeout_s
    for line in lines:
        assert time.monotonic() < deadline, f"no {until!r} event within {timeout_s} s: {found}"
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            found.append((name, json.loads(line.removeprefix("data: "))))
            if name == until:
                return found
    raise AssertionError(f"the stream ended before an {until!r} event: {found}")


def test_the_runs_list_follows_its_running_evaluations_in_one_stream(
    gateway: str, api: httpx.Client, redis_client: Redis, store: ArtifactStore
) -> None:
    first = data.submit(api, [7, 16], "first")
    second = data.submit(api, [44], "second")
    cookies = signed_in(gateway, ADMIN_KEY)
    runs = httpx.get(f"{gateway}/dashboard/runs", cookies=cookies).text
    found = re.search(r'data-events="([^"]+)"', runs)
    assert found is not None and runs.count("data-events=") == 1  # one stream for the whole list
    url = found.group(1).replace("&amp;", "&")
    assert first["id"] in url and second["id"] in url
    with httpx.stream("GET", f"{gateway}{url}", cookies=cookies, timeout=20) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        lines = response.iter_lines()
        opening = events(lines, "progress")
        assert opening[-1][1]["status"] == "queued"
        data.finish(redis_client, store, second, 44, VerdictStatus.PASSED)
        moved = [e for _, e in events(lines, "progress") if e["evaluation_id"] == second["id"]]
        while not moved or moved[-1]["status"] != "completed":
            moved = [e for _, e in events(lines, "progress") if e["evaluation_id"] == second["id"]]
        assert moved[-1]["counts"].get("done") == 1
        data.finish(redis_client, store, first, 7, VerdictStatus.PASSED)
        data.finish(redis_client, store, first, 16, VerdictStatus.FAILED)
        ended = events(lines, "end")
        assert ended[-1][1] == {"statuses": {first["id"]: "completed", second["id"]: "completed"}}


def test_an_evaluations_stream_sends_verdicts_and_ends(
    gateway: str, api: httpx.Client, redis_client: Redis, store: ArtifactStore
) -> None:
    evaluation = data.submit(api, [7, 16], "m")
    cookies = signed_in(gateway, ADMIN_KEY)
    url = f"{gateway}/dashboard/evaluations/{evaluation['id']}/events"
    with httpx.stream("GET", url, cookies=cookies, timeout=20) as response:
        lines = response.iter_lines()
        counts = events(lines, "progress")[-1][1]["counts"]
        assert counts["queued"] == 2 and counts["done"] == 0
        data.finish(redis_client, store, evaluation, 7, VerdictStatus.PASSED)
        verdict = events(lines, "verdict")[-1][1]
        assert verdict["task_index"] == 7 and verdict["status"] == "passed"
        data.finish(redis_client, store, evaluation, 16, VerdictStatus.FAILED)
        tail = events(lines, "end")
        assert tail[-2][0] == "verdict" and tail[-2][1]["task_index"] == 16 and tail[-2][1]["status"] == "failed"
        assert tail[-1][1] == {"status": "completed", "statuses": {evaluation["id"]: "completed"}}


def test_streams_follow_the_keys_rights(gateway: str, api: httpx.Client, redis_client: Redis) -> None:
    hidden = data.submit(api, [7], "admins")
    _, bob = ApiKeyStore(redis_client).create("bob")
    cookies = signed_in(gateway, bob)
    for path in (f"/dashboard/evaluations/{hidden['id']}/events", f"/dashboard/runs/events?ids={hidden['id']}"):
        refused = httpx.get(f"{gateway}{path}", cookies=cookies)
        assert refused.status_code == 404 and "admins" not in refused.text, path
        assert httpx.get(f"{gateway}{path}").status_code == 401  # no session


def test_open_streams_do_not_hold_the_gateways_threads(gateway: str, api: httpx.Client) -> None:
    evaluation = data.submit(api, [7], "m")  # queued: nothing runs it, its stream stays open
    cookies = signed_in(gateway, ADMIN_KEY)
    streams = WORKER_THREADS + 10

    async def scenario() -> float:
        limits = httpx.Limits(max_connections=streams + 5)
        async with httpx.AsyncClient(base_url=gateway, cookies=cookies, limits=limits, timeout=30) as client:
            opened = asyncio.Event()
            started = 0

            async def follow() -> None:
                nonlocal started
                path = f"/dashboard/evaluations/{evaluation['id']}/events"
                async with client.stream("GET", path) as response:
                    assert response.status_code == 200
                    async for line in response.aiter_lines():
                        if line.startswith("event: progress"):
                            started += 1
                            if started == streams:
                                opened.set()
                            await asyncio.sleep(3600)

            followers = [asyncio.create_task(follow()) for _ in range(streams)]
            try:
                await asyncio.wait_for(opened.wait(), timeout=30)
                began = time.monotonic()
                page = await client.get(f"/dashboard/evaluations/{evaluation['id']}")
                health = await client.get("/health")
                assert page.status_code == 200 and health.status_code == 200
                return time.monotonic() - began
            finally:
                for follower in followers:
                    follower.cancel()
                await asyncio.gather(*followers, return_exceptions=True)

    assert asyncio.run(scenario()) < 5.0
