"""The ``Judge``: asks a chat model on an OpenAI-compatible endpoint for a judgment, through the one endpoint
client (``services.endpoint.client``: its retry policy, Retry-After and key redaction).

The judge asks for one JSON object. It requests structured output (``response_format`` ``json_schema``); when
the server rejects that (400 or 422, or any error status whose body names ``response_format``, as
llama-cpp-python's server answers 500 for ``json_schema``: such a 500 is not retried) it tries ``json_object``,
then the prompt alone, and remembers (per ``Judge``) the first format the server accepted.

Failure contract: whatever the endpoint or the judge model does, ``Judge.judge_absolute`` and
``Judge.judge_pairwise`` return a ``Judgment``, never raise: ``error`` when no usable chat completion came back
(no answer, 408/429/5xx after the retries, another HTTP error, a body that is not a chat completion, a URL the
egress guard refused), with the endpoint error's message as the reason; ``unparseable`` when the judge's answer
holds no valid verdict. Both count as not passed. Only programming errors raise (``TypeError``, ``ValueError``).
"""

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
from pydantic import SecretStr

from grader.judge.judgment import read_answer
from grader.judge.prompts import ABSOLUTE_USER_TEMPLATE, PAIRWISE_USER_TEMPLATE, PROMPTS, Prompt, prompt_hash
from grader.judge.render import DEFAULT_MAX_TRAJECTORY_CHARS, render_trajectory, shorten
from services.endpoint.client import (
    DEFAULT_BACKOFF_S,
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_MAX_BACKOFF_S,
    DEFAULT_RETRIES,
    EndpointClient,
    Reply,
)
from services.errors import ModelEndpointError
from services.verdict import JudgeMode, Judgment, JudgmentStatus, ResponseFormat

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 120.0
"""Seconds one request to the judge may take (read, write and pool); the connect timeout is separate."""

JUDGE_MAX_REPLY_BYTES = 2**20
"""The most bytes of a judge's answer read (its verdict is a few hundred characters; a larger answer is refused)."""

DEFAULT_TEMPERATURE = 0.0
"""The judge's sampling temperature: a grade should not depend on the dice."""

DEFAULT_MAX_TOKENS = 1000
"""The judge's answer budget (PyBench's evaluator used 1000)."""

MAX_QUERY_CHARS = 4_000
"""The rendered size of the user's query in a prompt."""

MAX_RAW_ANSWER_CHARS = 4_000
"""The judge's raw answer kept in a judgment."""

MAX_REASON_CHARS = 1_000
"""The reason kept in a judgment."""

FORMAT_REJECTED_STATUSES = frozenset({400, 422})
"""Statuses that make the judge try the next, simpler response format (besides an error naming the format)."""

_FALLBACK = {ResponseFormat.JSON_SCHEMA: ResponseFormat.JSON_OBJECT, ResponseFormat.JSON_OBJECT: ResponseFormat.PROMPT}


def rejects_format(reply: Reply) -> bool:
    """Whether an answer refuses the request's ``response_format``: 400 or 422, or an error status whose body
    names it (a server error that would only repeat itself when retried)."""
    if reply.status is None:
        return False
    if reply.status in FORMAT_REJECTED_STATUSES:
        return True
    return reply.status >= 400 and "response_format" in reply.text[:4000]


@dataclass
class _Exchange:
    """What came back from the endpoint for one judgment, format fallbacks included."""

    reply: Reply | None = None
    attempts: int = 0
    response_format: ResponseFormat | None = None
    notes: list[str] = field(default_factory=list)


class Judge:
    """An LLM judge on an OpenAI-compatible chat-completions endpoint.

    One instance may grade many trajectories (and from several threads); it remembers which response format
    the server accepts. Close it, or use it as a context manager.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: SecretStr | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        retries: int = DEFAULT_RETRIES,
        backoff_s: float = DEFAULT_BACKOFF_S,
        max_backoff_s: float = DEFAULT_MAX_BACKOFF_S,
        temperature: float = DEFAULT_TEMPERATURE,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        max_trajectory_chars: int = DEFAULT_MAX_TRAJECTORY_CHARS,
        response_format: ResponseFormat = ResponseFormat.JSON_SCHEMA,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """Make a judge.

        Args:
            base_url: the endpoint's base, e.g. ``http://127.0.0.1:8000/v1``.
            model: the judge model's name, as the endpoint knows it.
            api_key: sent as ``Authorization: Bearer``; never logged or returned.
            timeout_s: seconds per request (read, write, pool); ``connect_timeout_s`` to connect.
            retries, backoff_s, max_backoff_s: the endpoint client's retry policy (``services.endpoint.client``).
            temperature, max_tokens: the judge's sampling.
            max_trajectory_chars: the rendered size of each trajectory in a prompt.
            response_format: the first format to ask for; the judge falls back from it when rejected.
            transport: an httpx transport (``services.endpoint.netguard.pinned_transport``, tests); the default opens
                plain connections.

        Raises:
            TypeError: ``api_key`` is not a ``SecretStr`` (wrap it: ``SecretStr(key)``).
            ValueError: a URL that is not http(s), an empty model name, or a negative or zero limit.
        """
        if not base_url.startswith(("http://", "https://")):
            raise ValueError("base_url must be an http:// or https:// URL, e.g. http://127.0.0.1:8000/v1")
        if not model.strip():
            raise ValueError("model must name the judge model")
        if api_key is not None and not isinstance(api_key, SecretStr):
            raise TypeError("api_key must be a pydantic SecretStr (wrap it: SecretStr(key)) or None")
        if max_tokens <= 0 or max_trajectory_chars < 200:
            raise ValueError("max_tokens must be > 0 and max_trajectory_chars >= 200")
        self.model = model
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.max_trajectory_chars = max_trajectory_chars
        self._format = ResponseFormat(response_format)
        self._client = EndpointClient(
            base_url,
            model,
            api_key=api_key,
            role="judge",
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
            retries=retries,
            backoff_s=backoff_s,
            max_backoff_s=max_backoff_s,
            deadline_s=2 * timeout_s,
            max_reply_bytes=JUDGE_MAX_REPLY_BYTES,
            cap_setting="the judge's reply cap (grader.judge.client.JUDGE_MAX_REPLY_BYTES)",
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"Judge(base_url={self._client.base_url!r}, model={self.model!r}, format={self._format.value!r})"

    def __enter__(self) -> "Judge":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    @property
    def response_format(self) -> ResponseFormat:
        """The format the next request asks for (the last one the server accepted, or the first to try)."""
        return self._format

    def judge_absolute(self, query: str, messages: Sequence[Any]) -> Judgment:
        """Judge whether a trajectory fulfils the user's query.

        Args:
            query: the task's query.
            messages: the trajectory's messages, ``{"role", "content"}`` mappings (or ``Message`` objects).

        Returns:
            ``passed`` or ``failed`` with the judge's reason; ``unparseable`` or ``error`` otherwise.

        Raises:
            TypeError: ``query`` is not a string or a message is malformed.
        """
        trajectory = self._render(query, messages)
        user = ABSOLUTE_USER_TEMPLATE.format(query=shorten(query.strip(), MAX_QUERY_CHARS), trajectory=trajectory)
        return self._judge(JudgeMode.ABSOLUTE, user)

    def judge_pairwise(self, query: str, messages: Sequence[Any], reference: Sequence[Any]) -> Judgment:
        """Judge a candidate trajectory against a reference trajectory of the same task.

        The reference is shown first as "Agent 1", the candidate second as "Agent 2" (PyBench's order). The
        status is the judge's pass of the candidate; ``preference`` says which is better and
        ``reference_passed`` how the reference fared. An empty ``reference`` is shown as "no trajectory".

        Args:
            query: the task's query.
            messages: the candidate's messages, ``{"role", "content"}`` mappings (or ``Message`` objects).
            reference: the reference's messages (e.g. ``services.pybench.recordings.recording_of(...).messages``).

        Returns:
            ``passed`` or ``failed`` (the candidate) with the preference; ``unparseable`` or ``error`` otherwise.

        Raises:
            TypeError: ``query`` is not a string or a message is malformed.
        """
        candidate = self._render(query, messages)
        user = PAIRWISE_USER_TEMPLATE.format(
            query=shorten(query.strip(), MAX_QUERY_CHARS), reference=self._render(query, reference), candidate=candidate
        )
        return self._judge(JudgeMode.PAIRWISE, user)

    def _render(self, query: str, messages: Sequence[Any]) -> str:
        if not isinstance(query, str):
            raise TypeError(f"query is a string, not {type(query).__name__}")
        return render_trajectory(messages, query=query, max_chars=self.max_trajectory_chars)

    def _judge(self, mode: JudgeMode, user: str) -> Judgment:
        prompt = PROMPTS[mode]
        started = time.monotonic()
        exchange = self._ask(prompt, user)
        judgment = Judgment(
            mode=mode,
            status=JudgmentStatus.ERROR,
            judge_model=self.model,
            prompt_hash=prompt_hash(mode),
            attempts=exchange.attempts,
            response_format=exchange.response_format,
        )
        self._read(exchange, prompt, judgment)
        judgment.latency_s = time.monotonic() - started
        judgment.judged_at = datetime.now(UTC)
        judgment.reason = shorten(judgment.reason, MAX_REASON_CHARS)
        judgment.raw_answer = shorten(judgment.raw_answer, MAX_RAW_ANSWER_CHARS)
        if judgment.status in (JudgmentStatus.ERROR, JudgmentStatus.UNPARSEABLE):
            logger.warning("judge %s, %s mode: %s: %s", self.model, mode.value, judgment.status.value, judgment.reason)
        return judgment

    @staticmethod
    def _read(exchange: _Exchange, prompt: Prompt, judgment: Judgment) -> None:
        """Fill ``judgment`` from the endpoint's reply (status, reason, tokens, raw answer); every text in the
        reply is already redacted by the endpoint client."""
        assert exchange.reply is not None, "a judgment asks at least once"
        try:
            completion = exchange.reply.completion()
        except ModelEndpointError as exc:
            judgment.reason = " ".join([*exchange.notes, str(exc)])
            return
        judgment.prompt_tokens = completion.prompt_tokens
        judgment.completion_tokens = completion.completion_tokens
        read_answer(completion.text, completion.finish_reason, prompt, judgment)

    def _ask(self, prompt: Prompt, user: str) -> _Exchange:
        """Ask the endpoint, falling back to simpler response formats while the server rejects the format."""
        exchange = _Exchange()
        level = self._format
        messages = [{"role": "system", "content": prompt.system}, {"role": "user", "content": user}]
        while True:
            options: dict[str, Any] = {"temperature": self.temperature, "max_tokens": self.max_tokens}
            if level == ResponseFormat.JSON_SCHEMA:
                options["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": prompt.schema_name, "strict": True, "schema": prompt.schema},
                }
            elif level == ResponseFormat.JSON_OBJECT:
                options["response_format"] = {"type": "json_object"}
            final_when = rejects_format if "response_format" in options else None
            reply = self._client.chat(messages, options, final_when=final_when)
            exchange.reply = reply
            exchange.attempts += reply.requests
            if level in _FALLBACK and rejects_format(reply):
                exchange.notes.append(f"response_format {level.value} got HTTP {reply.status};")
                logger.info(
                    "judge endpoint %s rejected response_format %s (HTTP %s): trying %s",
                    self._client.base_url,
                    level.value,
                    reply.status,
                    _FALLBACK[level].value,
                )
                level = _FALLBACK[level]
                continue
            if reply.status == 200:
                exchange.response_format = level
                if level != self._format:
                    logger.info("judge endpoint %s: using response_format %s from now on", self._client.base_url, level)
                    self._format = level
            return exchange
