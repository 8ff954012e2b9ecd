"""The request body limit, enforced on the bytes that arrive, declared or not.

A ``Content-Length`` over the limit is refused before anything is read; a body sent without one (chunked
transfer encoding) is counted as it streams in and refused (413) the moment it passes the limit, so a
client cannot make the gateway read and parse more than ``PBE_MAX_BODY_BYTES``.
"""

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import HTTPException

from gateway.problems import problem_response

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]


def too_large_detail(max_bytes: int) -> str:
    return f"the body may be at most {max_bytes} bytes; send less"


class BodySizeLimit:
    """ASGI middleware: a declared ``Content-Length`` over ``max_bytes`` is answered 413 at once; otherwise the
    app's ``receive`` raises a 413 ``HTTPException`` once more than ``max_bytes`` of body arrived (the app's problem
    handlers turn it into ``application/problem+json``)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_bytes:
            refusal = problem_response(413, "Request too large", too_large_detail(self.max_bytes), scope["path"])
            await refusal(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise HTTPException(413, too_large_detail(self.max_bytes))
            return message

        await self.app(scope, limited, send)
