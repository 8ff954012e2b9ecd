"""A scripted OpenAI-compatible judge server for the tests, served for real on loopback by ``tests.servers.serve``.

Each request to ``POST /v1/chat/completions`` is recorded and answered by the next scripted ``Step``. A
server-wide ``rejected_formats`` set makes it answer 400 to those ``response_format`` types, as a server
without structured output does, without using a step. An exhausted script answers 500, so a test that
sends more requests than it scripted fails loudly.
"""

import asyncio
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response


@dataclass(frozen=True)
class Step:
    """One scripted answer: a chat completion whose content is ``content``, or an HTTP error."""

    content: str | None = None
    status: int = 200
    body: Any = None
    """The raw JSON body of an error answer, or of a 200 that is not a chat completion; None for the default."""
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    """Seconds to wait before answering (to make a client time out)."""


@dataclass(frozen=True)
class Recorded:
    """A request the server received."""

    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def response_format(self) -> str | None:
        value = self.body.get("response_format")
        return value.get("type") if isinstance(value, dict) else None

    @property
    def prompt(self) -> str:
        """The request's messages' contents, joined."""
        return "\n".join(str(m.get("content")) for m in self.body.get("messages", []))


class JudgeServer:
    """The script, the recorded requests and the ASGI app."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.steps: deque[Step] = deque()
        self.requests: list[Recorded] = []
        self.rejected_formats: set[str] = set()
        self.app = self._make_app()

    def reset(self) -> None:
        with self._lock:
            self.steps.clear()
            self.requests.clear()
            self.rejected_formats = set()

    def script(self, *steps: Step) -> None:
        with self._lock:
            self.steps.extend(steps)

    @property
    def remaining(self) -> int:
        return len(self.steps)

    def _next(self, recorded: Recorded) -> Step | None:
        with self._lock:
            self.requests.append(recorded)
            if recorded.response_format in self.rejected_formats:
                return None
            return self.steps.popleft() if self.steps else Step(status=500, body={"error": {"message": "no script"}})

    def _make_app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat_completions(request: Request) -> Response:
            body = await request.json()
            recorded = Recorded(headers=dict(request.headers), body=body)
            step = self._next(recorded)
            if step is None:
                message = f"response_format type {recorded.response_format!r} is not supported by this server"
                return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}}, status_code=400)
            if step.delay_s:
                await asyncio.sleep(step.delay_s)
            if step.status != 200 or step.body is not None:
                payload = step.body if step.body is not None else {"error": {"message": f"HTTP {step.status}"}}
                return JSONResponse(payload, status_code=step.status, headers=step.headers)
            completion = {
                "id": f"chatcmpl-{len(self.requests)}",
                "object": "chat.completion",
                "model": body.get("model", ""),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": step.content},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 321, "completion_tokens": 45, "total_tokens": 366},
            }
            return JSONResponse(completion, headers=step.headers)

        return app
