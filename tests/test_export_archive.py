"""Exporting a whole evaluation in a few requests (the archive route), and a client that waits out rate limits.

Real components: a real Redis, the gateway served on loopback, the artifact store on disk, and for the client's
waiting a real HTTP server that answers 429 as a rate-limited gateway does.
"""

import io
import json
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from redis import Redis

from gateway.app import create_app
from gateway.cli import main
from gateway.cli.errors import CommandError
from gateway.cli.export import read_archive
from gateway.client import GatewayClient, GatewayError
from services.lifecycle import TaskLifecycle
from services.live.apikeys import ApiKeyStore
from services.store import ArtifactStore
from services.verdict import VerdictStatus
from tests.factories import make_submission, make_trajectory, make_verdict
from tests.fixtures import ADMIN_KEY, gateway_settings
from tests.servers import serve

RATE_LIMIT = 10
"""Requests a minute each key may make in these tests: a file-by-file export of 143 tasks would need 400+."""


@pytest.fixture()
def artifacts(tmp_path: Path) -> Path:
    return tmp_path / "artifacts"


@pytest.fixture()
def gateway(redis_url: str, redis_client: Redis, suite_path: Path, artifacts: Path) -> Iterator[str]:
    settings = gateway_settings(redis_url, suite_path, artifacts, RATE_LIMIT_PER_MINUTE=RATE_LIMIT)
    with serve(create_app(settings)) as url:
        yield url


def _full_evaluation(gateway: str, redis_client: Redis, artifacts: Path) -> tuple[str, list[int]]:
    """An evaluation of every task of the suite, each with a stored trajectory, one saved file and a verdict."""
    with GatewayClient(gateway, api_key=ADMIN_KEY) as client:
        evaluation = client.submit(make_submission())["evaluation"]
    evaluation_id, tasks = evaluation["id"], evaluation["tasks"]
    store = ArtifactStore(artifacts)
    lifecycle = TaskLifecycle(redis_client)
    for task in tasks:
        store.put_trajectory(make_trajectory(evaluation_id, task, "done", query=f"query of task {task}"))
        store.put_output_file(evaluation_id, task, 1, f"plots/{task}.csv", f"task,{task}\n".encode())
        lifecycle.record_verdict(make_verdict(evaluation_id, task, VerdictStatus.PASSED))
    return evaluation_id, tasks


def test_a_full_suite_exports_with_the_default_sized_limits_in_a_few_requests(
    gateway: str, redis_client: Redis, artifacts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    evaluation_id, tasks = _full_evaluation(gateway, redis_client, artifacts)
    assert len(tasks) > 100
    sent: list[str] = []
    real_send = httpx.Client.send

    def counting_send(self: httpx.Client, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        sent.append(request.url.path)
        return real_send(self, request, **kwargs)

    monkeypatch.setattr(httpx.Client, "send", counting_send)
    monkeypatch.setenv("PBE_GATEWAY_URL", gateway)
    monkeypatch.setenv("PBE_API_KEY", ADMIN_KEY)
    out = tmp_path / "export"
    assert main(["export", evaluation_id, "--out", str(out), "--files"]) == 0
    assert len(sent) <= 3, sent  # the evaluation, the suite's tasks, the archive
    assert f"/v1/evaluations/{evaluation_id}/archive" in sent
    records = [json.loads(line) for line in (out / "trajectory.jsonl").read_text().splitlines()]
    assert [int(r["index"]) for r in records] == sorted(tasks)
    assert records[0]["messages"][0]["content"] == f"query of task {min(tasks)}"
    for task in tasks:
        assert (out / "files" / str(task) / "plots" / f"{task}.csv").read_text() == f"task,{task}\n"
    results = json.loads((out / "results.json").read_text())
    assert len(results["verdicts"]) == len(tasks)


def test_the_archive_holds_the_latest_attempt_and_no_other_keys_evaluation(
    gateway: str, redis_client: Redis, artifacts: Path, tmp_path: Path
) -> None:
    evaluation_id, tasks = _full_evaluation(gateway, redis_client, artifacts)
    with GatewayClient(gateway, api_key=ADMIN_KEY) as admin:
        path = tmp_path / "a.tar.gz"
        size = admin.archive(evaluation_id, path)
    assert size == path.stat().st_size > 0
    with tarfile.open(path, "r:gz") as archive:
        names = archive.getnames()
    assert f"{evaluation_id}/evaluation.json" in names and f"{evaluation_id}/results.json" in names
    assert f"{evaluation_id}/tasks/{tasks[0]}/trajectory.json" in names
    _, other = ApiKeyStore(redis_client).create("erin")
    with GatewayClient(gateway, api_key=other) as stranger, pytest.raises(GatewayError) as refused:
        stranger.archive(evaluation_id, tmp_path / "b.tar.gz")
    assert refused.value.status in (403, 404)
    assert not (tmp_path / "b.tar.gz").exists()


def _tar(members: list[tarfile.TarInfo]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for member in members:
            archive.addfile(member, io.BytesIO(b"x" * member.size) if member.isfile() else None)
    return buffer.getvalue()


@pytest.mark.parametrize("kind", ["dot-dot", "symlink", "other-evaluation"])
def test_an_archive_with_a_hostile_member_is_refused(kind: str, tmp_path: Path) -> None:
    member = tarfile.TarInfo("ev1/tasks/1/output/a.txt")
    member.size = 1
    if kind == "dot-dot":
        member.name = "ev1/tasks/1/output/../../../../etc/x"
    elif kind == "symlink":
        member.type, member.linkname, member.size = tarfile.SYMTYPE, "/etc/passwd", 0
    else:
        member.name = "ev2/results.json"
    path = tmp_path / "hostile.tar.gz"
    path.write_bytes(_tar([member]))
    with pytest.raises(CommandError, match="unexpected member"):
        read_archive(path, "ev1")


@pytest.fixture()
def limited_server() -> Iterator[tuple[str, list[float]]]:
    """A real HTTP server that refuses the first two calls with 429 and ``Retry-After: 1``, then answers."""
    seen: list[float] = []
    app = FastAPI()

    @app.get("/v1/evaluations/{evaluation_id}")
    def view(evaluation_id: str) -> Any:
        seen.append(time.monotonic())
        if len(seen) <= 2:
            return JSONResponse(
                {"detail": "this key may make 2 requests a minute"}, status_code=429, headers={"Retry-After": "1"}
            )
        return {"evaluation": {"id": evaluation_id}}

    @app.get("/v1/evaluations/{evaluation_id}/results")
    def busy(evaluation_id: str) -> Any:
        seen.append(time.monotonic())
        return JSONResponse({"detail": "redis is down"}, status_code=503)

    with serve(app) as url:
        yield url, seen


def test_the_client_waits_out_429_as_retry_after_says(limited_server: tuple[str, list[float]]) -> None:
    url, seen = limited_server
    waits: list[tuple[float, str]] = []
    with GatewayClient(url, on_wait=lambda s, why: waits.append((s, why))) as client:
        assert client.evaluation("ev1") == {"evaluation": {"id": "ev1"}}
    assert len(seen) == 3 and seen[2] - seen[0] >= 1.9
    assert waits == [(1.0, "HTTP 429: this key may make 2 requests a minute")] * 2


def test_the_client_gives_up_once_its_waiting_budget_is_spent(limited_server: tuple[str, list[float]]) -> None:
    url, seen = limited_server
    started = time.monotonic()
    with GatewayClient(url, max_wait_s=1.5) as client, pytest.raises(GatewayError) as refused:
        client.evaluation("ev1")
    assert refused.value.status == 429 and len(seen) == 2
    assert time.monotonic() - started < 1.5


def test_a_503_without_retry_after_is_not_asked_again(limited_server: tuple[str, list[float]]) -> None:
    url, seen = limited_server
    with GatewayClient(url) as client, pytest.raises(GatewayError) as refused:
        client.results("ev1")
    assert refused.value.status == 503 and len(seen) == 1
