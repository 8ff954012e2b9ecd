"""The one client of OpenAI-compatible endpoints (chat completions and the model list), on httpx.

Every caller of a model endpoint goes through ``EndpointClient``: the agent loop (``executor.agent``), the LLM
judge (``grader.judge``) and both preflights (``gateway.preflight`` at submission, ``gateway.cli.preflight`` on
the CLI's machine). So there is one retry policy, one reading of ``Retry-After`` and one redaction rule.

A call has two steps. ``chat`` and ``listing`` send the request under the retry policy and return a ``Reply``:
the endpoint's last HTTP answer, or why none came. ``Reply.completion`` and ``Reply.models`` read it, or raise.
``complete`` and ``models`` do both steps. A caller that must tell answers apart before they become errors (the
judge's response-format fallback, the preflights' own messages) looks at the ``Reply`` first.

Retry policy: a connection error or a timeout, and HTTP 408, 429, 500, 502, 503 and 504, are retried, at most
``retries`` times. Before a retry the client waits ``backoff_s`` doubled at each retry times a random factor in
[0.5, 1.5) (jitter), or what ``Retry-After`` asks (seconds, or an HTTP date), never more than
``max_backoff_s``. Nothing else is retried: not an egress refusal, not another status (a 4xx is the user's to
fix: asking again cannot help), and not an answer the caller's ``final_when`` calls final.

Errors (``services.errors``), raised by ``Reply.completion`` and ``Reply.models`` (hence by ``complete`` and
``models``)::

    ModelEndpointError
    ├── ModelUnreachableError         no answer after the retries (connection refused, DNS, timeout: raised from
    │                                 the httpx error), a URL the egress guard refused (raised from
    │                                 ``EgressRefusedError``), or still 408/429/5xx after the retries
    └── ModelResponseError            an answer that is not a chat completion (or a model list): a 3xx, another
        │                             5xx, a malformed body
        ├── ModelContextLengthError   a chat completion refused with HTTP 400 or 413 because the conversation
        │                             no longer fits the model's context
        └── ModelRequestRejectedError any other 4xx (not 408, 429): an unknown model, a wrong key, a task a replay
                                      endpoint cannot serve; never retried, the message says what to fix

``chat`` and ``listing`` raise nothing for what the endpoint does (``chat`` raises ``ValueError`` when the client
has no model); the constructor raises ``ValueError`` for a negative limit.

The API key is sent as a bearer token only; every text that came back is redacted (``services.endpoint.redaction``)
before anyone sees it, so the key appears in no message, log line, ``Reply`` or repr.
"""

import email.utils
import json
import logging
import math
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import httpx
from pydantic import BaseModel, SecretStr

from services.endpoint.netguard import EgressRefusedError
from services.endpoint.redaction import redact
from services.errors import (
    ModelContextLengthError,
    ModelRequestRejectedError,
    ModelResponseError,
    ModelUnreachableError,
)

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 300.0
"""Seconds one request may take (read, write, pool): a long completion of a large model on a busy server."""

DEFAULT_CONNECT_TIMEOUT_S = 10.0
"""Seconds to open a connection to the endpoint."""

DEFAULT_DEADLINE_S = 600.0
"""Seconds one request may take in all, however the answer trickles in (the per-read ``timeout_s`` alone lets an
endpoint that sends a byte now and then hold a caller for ever); past it the request counts as timed out."""

DEFAULT_MAX_REPLY_BYTES = 8 * 2**20
"""The most bytes of one chat-completion answer that are read (a long completion is a few hundred KB); the rest is
never read and the answer is refused as too large (``ReplyTooLargeError``)."""

DEFAULT_MAX_LISTING_BYTES = 2**20
"""The most bytes of a ``/models`` answer that are read."""

DEFAULT_RETRIES = 3
"""Retries after a connection error, a timeout, or HTTP 408, 429, 500, 502, 503, 504: at most four requests."""

DEFAULT_BACKOFF_S = 1.0
"""The wait before the first retry; it doubles at each retry, times a random factor in [0.5, 1.5)."""

DEFAULT_MAX_BACKOFF_S = 60.0
"""The longest wait between two requests: a longer backoff, or a longer ``Retry-After``, waits this long."""

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
"""The HTTP statuses that are retried: the endpoint is busy or down for a moment."""

CONTEXT_LENGTH_STATUSES = frozenset({400, 413})
"""The statuses with which servers refuse a conversation that no longer fits the context."""

MAX_SNIPPET_CHARS = 300
"""How much of an answer's body an error message quotes (after redaction)."""

CONTEXT_LENGTH_WORDING = re.compile(
    r"context[_ ]length|maximum context|context window|too many tokens|prompt is too long|exceeds? the "
    r"(?:model'?s? )?(?:maximum|max)|n_ctx|longer than the model",
    re.IGNORECASE,
)
"""How vLLM, llama.cpp, OpenAI and others word a request that does not fit the context (in a 400 or 413)."""

_REJECTION_HINTS = {
    401: "check the API key",
    403: "check the API key and that it may use this model",
    404: "check the base URL (it ends in /v1) and the model name; a replay endpoint answers 404 for a task it "
    "has no recording of",
    413: "the request is too large for this endpoint: shorten it or use an endpoint that takes larger requests",
}
"""What to fix, by status, when the endpoint refuses a request."""


class ReplyTooLargeError(Exception):
    """An answer's body grew past the client's byte cap while it was read (the rest was never read)."""

    def __init__(self, cap: int, status: int, setting: str = "") -> None:
        super().__init__(f"{cap:,} bytes")
        self.cap, self.status, self.setting = cap, status, setting


class DeadlineExceededError(httpx.TimeoutException):
    """One request took longer in all than the client's deadline (its answer was still trickling in)."""


def _snippet(text: str) -> str:
    return text[:MAX_SNIPPET_CHARS]


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


def _attempts(count: int) -> str:
    return "1 attempt" if count == 1 else f"{count} attempts"


@dataclass(frozen=True)
class Completion:
    """A chat completion, read from the endpoint's answer."""

    text: str
    """The reply's content ('' when it has none)."""
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_s: float
    """Wall time of the whole call, retries included."""
    finish_reason: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """The reply's calls of the tools offered (OpenAI's ``tool_calls``), in order."""
    requests: int = 1
    """HTTP requests sent for it, retries included (0 for a reply replayed from the evaluation's reply cache)."""
    replayed: bool = False
    """It came from the evaluation's reply cache (``services.live.replies``): no model call was made for it."""


@dataclass(frozen=True)
class Reply:
    """What came back for one call, after the retries: the last HTTP answer, or why none came.

    Its ``text`` is already redacted; ``failure`` is set when ``status`` is None, or when the answer was too large
    to read (``ReplyTooLargeError``).
    """

    role: str
    """What the endpoint is to the caller (``model``, ``judge``), for messages."""
    url: str
    """The URL called."""
    status: int | None
    """The last answer's HTTP status; None when no answer came."""
    text: str = ""
    """The last answer's body, with the API key cut out."""
    requests: int = 0
    """HTTP requests sent (or refused by the egress guard), retries included."""
    latency_s: float = 0.0
    """Wall time of the whole call, retries included."""
    failure: Exception | None = None
    """Why no answer came: an ``httpx.TransportError`` (timeouts and ``DeadlineExceededError`` included), an
    ``EgressRefusedError``, or a ``ReplyTooLargeError`` (then ``status`` is the answer's)."""

    def check(self) -> None:
        """Raise unless the reply is an HTTP 200.

        Raises:
            ModelUnreachableError: no answer, or still 408/429/5xx after the retries.
            ModelRequestRejectedError: a 4xx other than 408 and 429.
            ModelResponseError: another status (a redirect, a 5xx that is not retried).
        """
        if self.status is None:
            raise self._unanswered() from self.failure
        if isinstance(self.failure, ReplyTooLargeError):
            raise ModelResponseError(
                f"the {self.role} endpoint's answer (HTTP {self.status}, {self.url}) is larger than {self.failure}; "
                "it was not read. Check the endpoint, or raise "
                + (self.failure.setting or "the reply cap")
                + " if such answers are expected"
            ) from self.failure
        if self.status == 200:
            return
        if self.status in RETRY_STATUSES:
            raise ModelUnreachableError(
                f"the {self.role} endpoint {self.url} answered HTTP {self.status} {_times(self.requests)} "
                f"(last: {_snippet(self.text)[:200]}); it is overloaded or down: try again later"
            )
        if 400 <= self.status < 500:
            hint = _REJECTION_HINTS.get(self.status, "check the request's model name and sampling parameters")
            raise ModelRequestRejectedError(
                f"the {self.role} endpoint refused the request with HTTP {self.status} ({self.url}): "
                f"{_snippet(self.text)}; {hint}. Asking again will not help"
            )
        raise ModelResponseError(
            f"the {self.role} endpoint answered HTTP {self.status} ({self.url}): {_snippet(self.text)}; check that "
            "the base URL is that of an OpenAI-compatible API (ending in /v1)"
        )

    def completion(self) -> Completion:
        """Read the reply as a chat completion.

        Raises:
            ModelUnreachableError: no answer, or still 408/429/5xx after the retries.
            ModelContextLengthError: HTTP 400 or 413 saying that the conversation does not fit the context.
            ModelRequestRejectedError: another 4xx (not 408, 429).
            ModelResponseError: another status, or a 200 that is not a chat completion.
        """
        if self.status in CONTEXT_LENGTH_STATUSES and CONTEXT_LENGTH_WORDING.search(self.text):
            raise ModelContextLengthError(
                f"the conversation no longer fits the {self.role} model's context (HTTP {self.status}): "
                f"{_snippet(self.text)}"
            )
        self.check()
        try:
            payload = json.loads(self.text)
            choice = payload["choices"][0]
            message = choice["message"]
            content = message.get("content")
            calls = [dict(call) for call in message.get("tool_calls") or []]
            usage = payload.get("usage") or {}
            prompt_tokens, completion_tokens = (
                _count(usage.get("prompt_tokens")),
                _count(usage.get("completion_tokens")),
            )
            finish_reason = choice.get("finish_reason")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError) as exc:
            raise self._malformed("a chat completion") from exc
        return Completion(
            text="" if content is None else str(content),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            latency_s=self.latency_s,
            finish_reason=finish_reason if isinstance(finish_reason, str) else None,
            tool_calls=calls,
            requests=self.requests,
        )

    def models(self) -> list[str]:
        """Read the reply as a model list (``{"data": [{"id": ...}, ...]}``): the ids of the models served.

        Raises:
            ModelUnreachableError: no answer, or still 408/429/5xx after the retries.
            ModelRequestRejectedError: a 4xx other than 408 and 429 (a 404: the endpoint has no list).
            ModelResponseError: another status, or a 200 that is not a model list.
        """
        self.check()
        try:
            return [str(entry["id"]) for entry in json.loads(self.text)["data"]]
        except (ValueError, KeyError, IndexError, TypeError, RecursionError) as exc:
            raise self._malformed('a model list ({"data": [{"id": ...}]})') from exc

    def _unanswered(self) -> ModelUnreachableError:
        if isinstance(self.failure, EgressRefusedError):
            return ModelUnreachableError(f"the {self.role} endpoint {self.url} is not allowed: {self.failure}")
        if isinstance(self.failure, DeadlineExceededError):
            setting = " (PBE_MODEL_DEADLINE_S)" if self.role == "model" else ""
            return ModelUnreachableError(
                f"the {self.role} endpoint {self.url} was still sending its answer at the deadline{setting}: "
                f"{self.failure}, {_attempts(self.requests)}; check the endpoint, or raise the deadline if it is "
                "only slow"
            )
        return ModelUnreachableError(
            f"the {self.role} endpoint {self.url} did not answer after {_attempts(self.requests)} "
            f"({type(self.failure).__name__}); check that it is up and reachable from this host"
        )

    def _malformed(self, what: str) -> ModelResponseError:
        return ModelResponseError(
            f"the {self.role} endpoint's answer is not {what}: {_snippet(self.text)}; check that the base URL is "
            "that of an OpenAI-compatible API (ending in /v1)"
        )


def _count(value: Any) -> int | None:
    """A token count as the endpoint gave it, or None when it is not an integer."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def retry_after_s(value: str | None) -> float | None:
    """Seconds a ``Retry-After`` header asks to wait: delta-seconds or an HTTP date (0 when past); None when
    absent or invalid. Raises nothing."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(seconds, 0.0) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - datetime.now(UTC)).total_seconds(), 0.0)


ChatMessage = Mapping[str, Any] | BaseModel
"""A chat message: a ``{"role", "content", ...}`` mapping, or a pydantic model of one (``Message``)."""


class EndpointClient:
    """A client of one OpenAI-compatible endpoint (``base_url``, e.g. ``http://host:8000/v1``) and one model.

    Thread-safe; close it, or use it as a context manager. See the module docstring for the retry policy and
    the errors.
    """

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        *,
        api_key: str | SecretStr | None = None,
        role: str = "model",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        retries: int = DEFAULT_RETRIES,
        backoff_s: float = DEFAULT_BACKOFF_S,
        max_backoff_s: float = DEFAULT_MAX_BACKOFF_S,
        deadline_s: float = DEFAULT_DEADLINE_S,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
        max_listing_bytes: int = DEFAULT_MAX_LISTING_BYTES,
        cap_setting: str = "",
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """Make a client; it opens no connection yet.

        Args:
            base_url: the API's base, ending in ``/v1`` as a rule.
            model: the model asked for chat completions; None for a client that only lists the models.
            api_key: sent as ``Authorization: Bearer``; never logged, returned or shown.
            role: what the endpoint is to the caller (``model``, ``judge``), named in messages.
            timeout_s: seconds per request (read, write, pool); ``connect_timeout_s`` to connect.
            retries: retries of a connection error, a timeout or a retried status (``RETRY_STATUSES``).
            backoff_s: the first backoff, doubled at each retry, with jitter; ``max_backoff_s`` caps it and the
                ``Retry-After`` that is honoured.
            deadline_s: seconds one request may take in all (a timeout past it, retried like one); a read that
                blocks ends within ``timeout_s`` of it.
            max_reply_bytes: the most bytes of a chat-completion answer read; ``max_listing_bytes`` of ``/models``.
                A larger answer is not read on and not retried (``Reply.check`` raises ``ModelResponseError``).
            cap_setting: the setting that raises ``max_reply_bytes``, named when an answer is refused for its size.
            transport: an httpx transport, e.g. ``services.endpoint.netguard.pinned_transport(policy)`` so that only
                permitted addresses are reached; the default opens plain connections.

        Raises:
            ValueError: negative retries or backoffs, or a timeout, deadline or cap that is not positive.
        """
        if retries < 0 or backoff_s < 0 or max_backoff_s < 0 or min(timeout_s, connect_timeout_s, deadline_s) <= 0:
            raise ValueError("retries and backoffs must be >= 0, timeouts and the deadline > 0")
        if max_reply_bytes <= 0 or max_listing_bytes <= 0:
            raise ValueError("the reply byte caps must be > 0")
        self.deadline_s = deadline_s
        self.max_reply_bytes = max_reply_bytes
        self.max_listing_bytes = max_listing_bytes
        self.cap_setting = cap_setting
        key = api_key.get_secret_value() if isinstance(api_key, SecretStr) else api_key
        self._key = SecretStr(key or "")
        self.model = model
        self.role = role
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {key}"} if key else {},
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            transport=transport,
            follow_redirects=False,
        )

    def __repr__(self) -> str:
        return f"EndpointClient(role={self.role!r}, base_url={self.base_url!r}, model={self.model!r})"

    def __enter__(self) -> "EndpointClient":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    @property
    def base_url(self) -> str:
        return self._redact(str(self._http.base_url).rstrip("/"))

    def _redact(self, text: str) -> str:
        return redact(text, self._key.get_secret_value() or None)

    def complete(
        self,
        messages: Sequence[ChatMessage],
        sampling: Mapping[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> Completion:
        """Ask for one chat completion (``chat``, then ``Reply.completion``).

        Raises:
            ModelUnreachableError: no answer after the retries, or a refused URL.
            ModelContextLengthError: the conversation no longer fits the model's context.
            ModelRequestRejectedError: the endpoint refused the request (4xx other than 408, 429).
            ModelResponseError: another answer that is not a chat completion.
            ValueError: the client has no model.
        """
        return self.chat(messages, sampling, tools=tools).completion()

    def chat(
        self,
        messages: Sequence[ChatMessage],
        options: Mapping[str, Any] | None = None,
        *,
        tools: list[dict[str, Any]] | None = None,
        final_when: Callable[[Reply], bool] | None = None,
    ) -> Reply:
        """POST one chat-completion request under the retry policy and return what came back.

        Args:
            messages: the conversation; a pydantic model is sent as its ``model_dump()``.
            options: the request's other fields (sampling, ``max_tokens``, ``response_format``, ...).
            tools: offered through OpenAI's tools API when given.
            final_when: called with an answer that would be retried; when it returns True the answer is
                returned at once (a server error that would only repeat itself).

        Raises:
            ValueError: the client has no model.
        """
        if not self.model:
            raise ValueError("this client has no model: give one to ask for chat completions")
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [m.model_dump() if isinstance(m, BaseModel) else dict(m) for m in messages],
            **(options or {}),
        }
        if tools:
            body["tools"] = tools
        return self._send("POST", "/chat/completions", body, final_when, self.max_reply_bytes, self.cap_setting)

    def models(self) -> list[str]:
        """The ids of the models the endpoint lists (``listing``, then ``Reply.models``).

        Raises:
            ModelUnreachableError: no answer after the retries, or a refused URL.
            ModelRequestRejectedError: a 4xx other than 408 and 429 (404: the endpoint lists no models).
            ModelResponseError: another answer that is not a model list.
        """
        return self.listing().models()

    def listing(self) -> Reply:
        """GET ``/models`` under the retry policy and return what came back. Raises nothing."""
        return self._send("GET", "/models", None, None, self.max_listing_bytes, "")

    def _read(
        self, method: str, path: str, body: dict[str, Any] | None, cap: int, setting: str
    ) -> tuple[int, str, str | None]:
        """One request: its status, its body (decoded, redacted) and its ``Retry-After``.

        Raises:
            httpx.TransportError: no answer, or ``DeadlineExceededError`` past ``deadline_s``.
            EgressRefusedError: the egress guard refused the address.
            ReplyTooLargeError: the body grew past ``cap`` bytes (its status is the error's ``status``; ``setting``
                raises the cap).
        """
        deadline = time.monotonic() + self.deadline_s
        with self._http.stream(method, path, json=body) as response:
            chunks: list[bytes] = []
            size = 0
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > cap:
                    raise ReplyTooLargeError(cap, response.status_code, setting)
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise DeadlineExceededError(f"the answer took longer than {self.deadline_s:g} s in all")
            if time.monotonic() > deadline:
                raise DeadlineExceededError(f"the answer took longer than {self.deadline_s:g} s in all")
            text = b"".join(chunks).decode(response.encoding or "utf-8", errors="replace")
            return response.status_code, self._redact(text), response.headers.get("retry-after")

    def _send(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        final_when: Callable[[Reply], bool] | None,
        cap: int,
        setting: str,
    ) -> Reply:
        url = self.base_url + path
        started = time.monotonic()
        for attempt in range(self.retries + 1):
            try:
                status, text, retry_after = self._read(method, path, body, cap, setting)
            except EgressRefusedError as exc:
                return _timed(Reply(self.role, url, None, requests=attempt + 1, failure=exc), started)
            except ReplyTooLargeError as exc:
                return _timed(Reply(self.role, url, exc.status, requests=attempt + 1, failure=exc), started)
            except httpx.TransportError as exc:
                reply = Reply(self.role, url, None, requests=attempt + 1, failure=exc)
                wait = None
            else:
                reply = Reply(self.role, url, status, text, attempt + 1)
                if status not in RETRY_STATUSES or (final_when is not None and final_when(reply)):
                    return _timed(reply, started)
                wait = retry_after_s(retry_after)
            if attempt == self.retries:
                return _timed(reply, started)
            if wait is None:
                wait = self.backoff_s * (2**attempt) * (0.5 + random.random())
            wait = min(wait, self.max_backoff_s)
            problem = f"HTTP {reply.status}" if reply.status is not None else type(reply.failure).__name__
            logger.warning(
                "%s endpoint %s: %s; retry %d of %d in %.2f s", self.role, url, problem, attempt + 1, self.retries, wait
            )
            time.sleep(wait)
        raise AssertionError("unreachable: the last attempt returns")  # pragma: no cover


def _timed(reply: Reply, started: float) -> Reply:
    """``reply`` with the wall time since ``started``."""
    return replace(reply, latency_s=time.monotonic() - started)
