"""The endpoint client against a real, scripted OpenAI-compatible server on loopback: retries with backoff on
408, 429 and 5xx (honouring Retry-After, as seconds or as an HTTP date, capped), a bounded number of them; any
other 4xx is refused after one request; a context-length error, an empty reply and a refused request end a
session cleanly with their own reason."""

import asyncio
import email.utils
import time
import tracemalloc
from collections import deque
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from executor.agent import run_agent
from services.endpoint.client import DeadlineExceededError, EndpointClient, retry_after_s
from services.errors import (
    ModelContextLengthError,
    ModelRequestRejectedError,
    ModelResponseError,
    ModelUnreachableError,
)
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
    client = EndpointClient(url, "m", retries=3, backoff_s=0.01)
    completion = client.complete([Message(role="user", content="q")], {})
    assert completion.text == "Finished: 42" and (completion.prompt_tokens, completion.completion_tokens) == (12, 3)
    assert len(server.times) == 3
    assert server.times[1] - server.times[0] >= 0.95  # Retry-After: 1, not the 10 ms backoff
    assert server.times[2] - server.times[1] < 0.9


def test_retries_are_bounded(script: tuple[Script, str]) -> None:
    server, url = script
    server.answers.extend([(503, {"error": "down"}, {})] * 5)
    client = EndpointClient(url, "m", retries=2, backoff_s=0.01)
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
    client = EndpointClient(url, "m", retries=3, backoff_s=0.01)
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
    client = EndpointClient(url, "m", retries=0)
    run = run_agent(
        [Message(role="user", content="q")], client, kernel=None, max_turns=3, cell_timeout_s=1, sampling={}
    )  # type: ignore[arg-type]
    assert run.end_reason is EndReason.EMPTY_REPLY and "length" in (run.error or "") and not run.end_reason.infra


CANARY = "sk-endpoint-canary-3d9b"
"""An API key that must reach the server as a bearer token and appear in no message or repr."""


def test_retry_after_as_an_http_date_is_honoured(script: tuple[Script, str]) -> None:
    server, url = script
    # An HTTP date has whole seconds: 3 s ahead is a wait of more than 2 s once truncated.
    when = email.utils.format_datetime(datetime.now(UTC) + timedelta(seconds=3), usegmt=True)
    server.answers.extend([(503, {"error": "busy"}, {"Retry-After": when}), (200, COMPLETION, {})])
    client = EndpointClient(url, "m", retries=1, backoff_s=0.01)
    assert client.complete([Message(role="user", content="q")]).text == "Finished: 42"
    assert len(server.times) == 2 and server.times[1] - server.times[0] >= 1.9


def test_retry_after_is_capped(script: tuple[Script, str]) -> None:
    server, url = script
    an_hour = email.utils.format_datetime(datetime.now(UTC) + timedelta(hours=1), usegmt=True)
    server.answers.extend([(429, {"error": "later"}, {"Retry-After": an_hour}), (200, COMPLETION, {})])
    client = EndpointClient(url, "m", retries=1, backoff_s=0.01, max_backoff_s=0.3)
    client.complete([Message(role="user", content="q")])
    assert 0.25 <= server.times[1] - server.times[0] < 2.0


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("2", 2.0), ("0.5", 0.5), ("-3", 0.0), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0), ("soon", None), ("", None)],
)
def test_retry_after_values(value: str, seconds: float | None) -> None:
    assert retry_after_s(value) == seconds


def test_408_is_retried(script: tuple[Script, str]) -> None:
    server, url = script
    server.answers.extend([(408, {"error": "request timeout"}, {}), (200, COMPLETION, {})])
    completion = EndpointClient(url, "m", retries=2, backoff_s=0.01).complete([Message(role="user", content="q")])
    assert completion.text == "Finished: 42" and completion.requests == 2 and len(server.times) == 2


@pytest.mark.parametrize(
    ("status", "body", "hint"),
    [
        (404, {"error": {"code": "task_not_recorded", "message": f"no recording (key {CANARY})"}}, "base URL"),
        (401, {"error": {"message": f"Incorrect API key provided: {CANARY}"}}, "API key"),
    ],
)
def test_a_4xx_is_rejected_after_exactly_one_request(
    script: tuple[Script, str], status: int, body: dict[str, object], hint: str
) -> None:
    server, url = script
    server.answers.extend([(status, body, {}), (200, COMPLETION, {})])
    client = EndpointClient(url, "m", api_key=CANARY, retries=3, backoff_s=0.01)
    with pytest.raises(ModelRequestRejectedError) as raised:
        client.complete([Message(role="user", content="q")])
    assert len(server.times) == 1, "a refused request is never asked again"
    message = str(raised.value)
    assert f"HTTP {status}" in message and hint in message and "[REDACTED]" in message
    assert CANARY not in message and CANARY not in repr(client)
    assert message.endswith("Asking again will not help"), "the message says a retry cannot help"


def test_the_agent_loop_ends_with_model_rejected_on_a_404(script: tuple[Script, str]) -> None:
    server, url = script
    server.answers.append((404, {"error": {"code": "task_not_recorded", "message": "no recording of this task"}}, {}))
    client = EndpointClient(url, "m", retries=3, backoff_s=0.01)
    run = run_agent(
        [Message(role="user", content="q")], client, kernel=None, max_turns=3, cell_timeout_s=1, sampling={}
    )  # type: ignore[arg-type]
    assert run.end_reason is EndReason.MODEL_REJECTED and "task_not_recorded" in (run.error or "")
    assert run.end_reason.infra and not run.end_reason.retryable
    assert len(server.times) == 1


class KernelThatBreaksForTests:
    """A test double of the kernel client whose cell raises what no caller expects (as a kernel message of a shape
    the client never saw could make it): the loop's boundary must turn it into the session's end."""

    def execute(self, code: str, timeout_s: float) -> None:
        raise KeyError("parent_header")


def test_an_unexpected_error_in_the_loop_ends_the_session_crashed_with_its_turns_kept(
    script: tuple[Script, str],
) -> None:
    server, url = script
    code = {"role": "assistant", "content": "```python\nprint(1)\n```"}
    reply = {**COMPLETION, "choices": [{"index": 0, "message": code}]}
    server.answers.append((200, reply, {}))
    client = EndpointClient(url, "m", retries=0)
    run = run_agent(
        [Message(role="user", content="q")],
        client,
        KernelThatBreaksForTests(),  # type: ignore[arg-type]
        max_turns=3,
        cell_timeout_s=1,
        sampling={},
    )
    assert run.end_reason is EndReason.CRASHED and "KeyError" in (run.error or "")
    assert run.end_reason.infra and not run.end_reason.retryable  # graded infra_error, never run again by itself
    assert [turn.code for turn in run.turns] == ["print(1)"] and run.messages[-1].role == "assistant"


class Misbehaving:
    """An endpoint that answers badly on purpose: huge, dripping or nested answers."""

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def huge() -> StreamingResponse:
            async def body() -> AsyncIterator[bytes]:
                yield b'{"choices": [{"message": {"content": "'
                for _ in range(4096):  # 256 MiB if it were all read
                    yield b"x" * 65536

            return StreamingResponse(body(), media_type="application/json")

        @app.get("/v1/models")
        async def drip() -> StreamingResponse:
            async def body() -> AsyncIterator[bytes]:
                yield b'{"data": ['
                for _ in range(600):  # a byte every 0.2 s for two minutes
                    await asyncio.sleep(0.2)
                    yield b" "

            return StreamingResponse(body(), media_type="application/json")

        @app.post("/v2/chat/completions")
        async def nested() -> Response:
            return Response(b'{"choices": ' + b"[" * 200_000 + b"]" * 200_000 + b"}", media_type="application/json")

        return app


@pytest.fixture()
def misbehaving() -> Iterator[tuple[Misbehaving, str]]:
    server = Misbehaving()
    with serve(server.app()) as url:
        yield server, url


def test_an_answer_over_the_byte_cap_is_not_read_on_and_ends_the_session_naming_the_setting(
    misbehaving: tuple[Misbehaving, str],
) -> None:
    _, url = misbehaving
    client = EndpointClient(url + "/v1", "m", retries=3, max_reply_bytes=2**20, cap_setting="PBE_MODEL_MAX_REPLY_BYTES")
    tracemalloc.start()
    try:
        reply = client.chat([Message(role="user", content="q")])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert reply.requests == 1 and reply.text == ""  # a size cap is not retried, and nothing of it is kept
    assert peak < 32 * 2**20, f"reading the answer took {peak / 2**20:.0f} MiB: it was read on past the cap"
    run = run_agent(
        [Message(role="user", content="q")], client, kernel=None, max_turns=3, cell_timeout_s=1, sampling={}
    )  # type: ignore[arg-type]
    assert run.end_reason is EndReason.MODEL_ERROR
    assert "1,048,576 bytes" in (run.error or "") and "PBE_MODEL_MAX_REPLY_BYTES" in (run.error or "")


def test_an_answer_that_trickles_in_ends_at_the_deadline_not_the_read_timeout(
    misbehaving: tuple[Misbehaving, str],
) -> None:
    _, url = misbehaving
    client = EndpointClient(url + "/v1", retries=1, backoff_s=0.01, timeout_s=30, deadline_s=1.0)
    started = time.monotonic()
    reply = client.listing()
    elapsed = time.monotonic() - started
    assert reply.status is None and isinstance(reply.failure, DeadlineExceededError) and reply.requests == 2
    assert elapsed < 5, f"two requests of a 1 s deadline took {elapsed:.1f} s"
    with pytest.raises(ModelUnreachableError, match=r"still sending its answer at the deadline \(PBE_MODEL_DEAD"):
        reply.models()
    with pytest.raises(ModelUnreachableError, match="longer than 1 s in all, 2 attempts"):
        reply.models()


def test_json_nested_past_the_parsers_depth_is_a_malformed_answer_not_a_crash(
    misbehaving: tuple[Misbehaving, str],
) -> None:
    _, url = misbehaving
    client = EndpointClient(url + "/v2", "m", retries=0)
    with pytest.raises(ModelResponseError, match="not a chat completion"):
        client.complete([Message(role="user", content="q")])
