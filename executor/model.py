"""A client for OpenAI-compatible chat-completion endpoints, on httpx.

Errors: ``ModelUnreachableError`` when the endpoint does not answer (connection refused, DNS, timeout) or
keeps answering 429/5xx after the retries (each retry waits a jittered, doubling backoff, or what
``Retry-After`` says); ``ModelContextLengthError`` when the conversation no longer fits the model's context;
``ModelResponseError`` for another answer that is not a usable completion. The API key is sent as a bearer
token and never appears in a message, a log or a repr.
"""

import random
import re
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from services.errors import ModelContextLengthError, ModelResponseError, ModelUnreachableError
from services.netguard import EgressRefusedError
from services.redaction import redact
from services.trajectory import Message

DEFAULT_RETRIES = 3
"""Retries after a connection error, 429 or 5xx, with jittered exponential backoff."""

DEFAULT_BACKOFF_S = 1.0
"""The first backoff; it doubles with each retry (plus jitter), or follows Retry-After when given."""

_RETRY_STATUS = {429, 500, 502, 503, 504}

_CONTEXT_LENGTH = re.compile(
    r"context[_ ]length|maximum context|context window|too many tokens|prompt is too long|exceeds? the (?:model'?s? )?"
    r"(?:maximum|max)|n_ctx|longer than the model",
    re.IGNORECASE,
)
"""How vLLM, llama.cpp, OpenAI and others word a request that does not fit the context (in a 400 or 413)."""


@dataclass(frozen=True)
class Completion:
    text: str
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_s: float
    finish_reason: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """The reply's calls of the tools offered (OpenAI's ``tool_calls``), in order."""


class ModelClient:
    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        retries: int = DEFAULT_RETRIES,
        backoff_s: float = DEFAULT_BACKOFF_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._secret = api_key or None
        self.model = model
        self.retries = retries
        self.backoff_s = backoff_s
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            transport=transport,
            follow_redirects=False,
        )

    def __repr__(self) -> str:
        return f"ModelClient(base_url={str(self._http.base_url)!r}, model={self.model!r})"

    def close(self) -> None:
        self._http.close()

    def _redact(self, text: str) -> str:
        """``text`` (an endpoint's answer, which may echo the request) without the API key in it."""
        return redact(text, self._secret)

    def _post(self, body: dict[str, Any]) -> httpx.Response:
        attempt = 0
        while True:
            delay = self.backoff_s * (2**attempt) * (0.5 + random.random())
            try:
                response = self._http.post("/chat/completions", json=body)
            except EgressRefusedError as exc:
                raise ModelUnreachableError(f"model endpoint {self._http.base_url} refused: {exc}") from exc
            except httpx.TransportError as exc:
                if attempt >= self.retries:
                    raise ModelUnreachableError(
                        f"model endpoint {self._http.base_url} did not answer: {type(exc).__name__}; "
                        "check that the server is up and reachable from the executor"
                    ) from exc
            else:
                if response.status_code not in _RETRY_STATUS:
                    return response
                if attempt >= self.retries:
                    raise ModelUnreachableError(
                        f"model endpoint {self._http.base_url} answered HTTP {response.status_code} "
                        f"{self.retries + 1} times; is it overloaded?"
                    )
                retry_after = response.headers.get("retry-after", "")
                if retry_after.isdigit():
                    delay = min(float(retry_after), 60.0)
            attempt += 1
            time.sleep(delay)

    def complete(
        self, messages: list[Message], sampling: dict[str, Any], tools: list[dict[str, Any]] | None = None
    ) -> Completion:
        """Ask for one chat completion, offering ``tools`` (OpenAI's tools API) when given.

        Raises:
            ModelUnreachableError: no answer after the retries.
            ModelResponseError: the answer is an error or not a chat completion.
        """
        body = {"model": self.model, "messages": [m.model_dump() for m in messages], **sampling}
        if tools:
            body["tools"] = tools
        started = time.monotonic()
        response = self._post(body)
        latency = time.monotonic() - started
        if response.status_code in (400, 413) and _CONTEXT_LENGTH.search(response.text):
            raise ModelContextLengthError(
                f"the conversation no longer fits the model's context: {self._redact(response.text)[:300]}"
            )
        if response.status_code != 200:
            raise ModelResponseError(
                f"model endpoint answered HTTP {response.status_code}: {self._redact(response.text)[:300]}"
            )
        try:
            payload = response.json()
            choice = payload["choices"][0]
            text = choice["message"].get("content") or ""
            calls = [dict(call) for call in choice["message"].get("tool_calls") or []]
            usage = payload.get("usage") or {}
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ModelResponseError(f"not a chat completion: {self._redact(response.text)[:300]}") from exc
        return Completion(
            text=str(text),
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            latency_s=latency,
            finish_reason=choice.get("finish_reason"),
            tool_calls=calls,
        )
