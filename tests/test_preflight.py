"""Endpoint preflight at submission, against real OpenAI-compatible servers on loopback: a good endpoint is
accepted; one that does not answer, does not serve the model, refuses the key or replies without code is
refused with a problem that says what to fix, and nothing is queued."""

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient
from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

from gateway.app import create_app
from services.queues import SESSIONS_QUEUE
from tests.fixtures import ADMIN_KEY, BODY, gateway_settings
from tests.servers import free_port, serve

KEY = "sk-preflight-canary-91c3"


@dataclass
class ModelServer:
    """A scripted model server: what it serves, what it replies, and the requests it saw."""

    models: list[str] = field(default_factory=lambda: ["m"])
    reply: str = "```python\nprint(17 * 23)\n```"
    status: int = 200
    seen: list[dict[str, object]] = field(default_factory=list)

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/v1/models")
        async def models(request: Request) -> JSONResponse:
            self.seen.append({"path": "/models", "authorization": request.headers.get("authorization")})
            return JSONResponse({"object": "list", "data": [{"id": m, "object": "model"} for m in self.models]})

        @app.post("/v1/chat/completions")
        async def complete(request: Request) -> JSONResponse:
            body = await request.json()
            self.seen.append({"path": "/chat/completions", "body": body})
            if self.status != 200:
                auth = request.headers.get("authorization")
                return JSONResponse({"error": {"message": f"overloaded ({auth})"}}, status_code=self.status)
            choice = {"index": 0, "message": {"role": "assistant", "content": self.reply}, "finish_reason": "stop"}
            return JSONResponse({"id": "c", "object": "chat.completion", "choices": [choice]})

        return app


@pytest.fixture()
def model() -> Iterator[tuple[ModelServer, str]]:
    server = ModelServer()
    with serve(server.app()) as url:
        yield server, url + "/v1"


@pytest.fixture()
def api(redis_url: str, redis_client: Redis, suite_path: Path, tmp_path: Path) -> Iterator[httpx.Client]:
    settings = gateway_settings(redis_url, suite_path, tmp_path, PREFLIGHT=True)
    with TestClient(create_app(settings)) as client:
        client.headers["Authorization"] = f"Bearer {ADMIN_KEY}"
        yield client


def submit(api: httpx.Client, url: str, **extra: object) -> httpx.Response:
    return api.post("/v1/evaluations", json={**BODY, "model": {"base_url": url, "model": "m"}, "api_key": KEY, **extra})


def test_a_good_endpoint_passes_preflight_under_the_evaluation_s_own_prompt(
    api: httpx.Client, model: tuple[ModelServer, str], suite_path: Path
) -> None:
    server, url = model
    response = submit(api, url)
    assert response.status_code == 201, response.text
    assert [s["path"] for s in server.seen] == ["/models", "/chat/completions"]
    assert server.seen[0]["authorization"] == f"Bearer {KEY}"
    body = server.seen[1]["body"]
    assert isinstance(body, dict)
    assert body["messages"][0]["content"] == (suite_path / "prompts" / "gpt.txt").read_text(encoding="utf-8")
    assert body["temperature"] == 0.2  # the prompt's own sampling


@pytest.mark.parametrize(
    ("setup", "title", "needle"),
    [
        ({"models": ["other-model"]}, "Model not served", "it serves: other-model"),
        ({"reply": "The answer is 391."}, "No code in the canary reply", "391"),
        ({"status": 503}, "Canary prompt failed", "HTTP 503"),
    ],
)
def test_a_bad_endpoint_is_refused_and_nothing_is_queued(
    api: httpx.Client,
    model: tuple[ModelServer, str],
    redis_client: Redis,
    setup: dict[str, object],
    title: str,
    needle: str,
) -> None:
    server, url = model
    for name, value in setup.items():
        setattr(server, name, value)
    response = submit(api, url)
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["title"] == title and needle in problem["detail"] and '"preflight": false' in problem["detail"]
    assert KEY not in response.text  # the 503 body echoes the key: it is cut out
    assert Queue(SESSIONS_QUEUE, connection=redis_client, serializer=JSONSerializer).count == 0
    assert api.get("/v1/evaluations").json()["items"] == []
    # The submitter may skip the check deliberately.
    assert submit(api, url, preflight=False).status_code == 201


def test_an_endpoint_that_does_not_answer_is_refused(api: httpx.Client) -> None:
    response = submit(api, f"http://127.0.0.1:{free_port()}/v1")
    assert response.status_code == 422 and response.json()["title"] == "Endpoint unreachable"
