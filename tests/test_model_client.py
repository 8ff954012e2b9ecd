"""The model client against a real, scripted OpenAI-compatible server on loopback: retries with backoff on 429
(honouring Retry-After) and 5xx, a bounded number of them; a context-length error and an empty reply end a
session cleanly with their own reason."""

import time
from collections import deque
from collections.abc import Iterator

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from executor.agent import run_agent
from executor.model import ModelClient
from services.errors import ModelContextLengthError, ModelUnreachableError
from services.trajectory import EndReason, Message
from tests.servers import serve

COMPLETION = {
    "id": "c",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Finished: 42"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 3},
}


class Script:
    """Answers in order: (status, body, headers); records when each request came."""

    def __init__(self) -> None:
        self.answers: deque[tuple[int, object, dict[str, str]]] = deque()
        self.times: list[float] = []

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def complete(_: Request) -> JSONResponse:
            self.times.append(time.monotonic())
            status, body, headers = self.answers.popleft() if self.answers else (500, {"error": "no script"}, {})
            return JSONResponse(body, status_code=status, headers=headers)

        return app


@pytest.fixture()
def script() -> Iterator[tuple[Script, str]]:
    scripted = Script()
    with serve(scripted.app()) as url:
        yield scripted, url + "/v1"


def test_429_and_5xx_are_retried_with_backoff_and_retry_after_is_honoured(script: tuple[Script, str]) -> None:
    server, url = script
    server.answers.extend(
        [
            (429, {"error": "slow down"}, {"Retry-After": "1"}),
            (502, {"error": "bad gateway"}, {}),
            (200, COMPLETION, {}),
        ]
    )
    client = ModelClient(url, "m", retries=3, backoff_s=0.01)
    completion = client.complete([Message(role="user", content="q")], {})
    assert completion.text == "Finished: 42" and (completion.prompt_tokens, completion.completion_tokens) == (12, 3)
    assert len(server.times) == 3
    assert server.times[1] - server.times[0] >= 0.95  # Retry-After: 1, not the 10 ms backoff
    assert server.times[2] - server.times[1] < 0.9


def test_retries_are_bounded(script: tuple[Script, str]) -> None:
    server, url = script
    server.answers.extend([(503, {"error": "down"}, {})] * 5)
    client = ModelClient(url, "m", retries=2, backoff_s=0.01)
    with pytest.raises(ModelUnreachableError, match="3 times"):
        client.complete([Message(role="user", content="q")], {})
    assert len(server.times) == 3


@pytest.mark.parametrize(
    "message",
    [
        "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens",  # vLLM / OpenAI
        "the request exceeds the available context size, try increasing n_ctx",  # llama.cpp
    ],
)
def test_a_context_length_error_ends_the_session_with_its_own_reason(script: tuple[Script, str], message: str) -> None:
    server, url = script
    server.answers.append((400, {"error": {"message": message, "type": "invalid_request_error"}}, {}))
    client = ModelClient(url, "m", retries=3, backoff_s=0.01)
    with pytest.raises(ModelContextLengthError):
        client.complete([Message(role="user", content="q")], {})
    assert len(server.times) == 1  # not retried
    server.answers.append((400, {"error": {"message": message}}, {}))
    run = run_agent(
        [Message(role="user", content="q")], client, kernel=None, max_turns=3, cell_timeout_s=1, sampling={}
    )  # type: ignore[arg-type]
    assert run.end_reason is EndReason.CONTEXT_LENGTH and not run.end_reason.infra


def test_an_empty_reply_ends_the_session_with_its_own_reason(script: tuple[Script, str]) -> None:
    server, url = script
    empty = {
        **COMPLETION,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "length"}],
    }
    server.answers.append((200, empty, {}))
    client = ModelClient(url, "m", retries=0)
    run = run_agent(
        [Message(role="user", content="q")], client, kernel=None, max_turns=3, cell_timeout_s=1, sampling={}
    )  # type: ignore[arg-type]
    assert run.end_reason is EndReason.EMPTY_REPLY and "length" in (run.error or "") and not run.end_reason.infra
