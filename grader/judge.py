"""The LLM judge: an OpenAI-compatible chat model grades a trajectory (PyBench's "Pass Rate (LLM)").

Two modes:

- ``absolute``: does the trajectory fulfil the user's query? The answer is passed or failed, with a reason.
- ``pairwise`` (the benchmark's mode): the judge sees a reference trajectory of the same task ("Agent 1", as in
  PyBench's evaluator) and the candidate ("Agent 2"), decides for each whether it passes, and which is better
  or a tie. The candidate's pass decides the judgment's status (what PyBench counts in its LLM pass rate); the
  comparison is kept as ``preference`` (win / tie / lose against the reference).

The judge asks for one JSON object and validates it with pydantic. It requests structured output
(``response_format`` ``json_schema``); when the server rejects that (400 or 422, or any error status whose body
names ``response_format``, as llama-cpp-python's server answers 500 for ``json_schema``) it tries
``json_object``, then the prompt alone, and remembers (per ``Judge``) the first format the server accepted.

Failure contract: whatever the endpoint or the judge model does, ``Judge.judge_absolute`` and
``Judge.judge_pairwise`` return a ``Judgment``, never raise: ``error`` when no usable chat completion came back
(connection failures, timeouts, 429/5xx after the retries, other HTTP errors, a body that is not a chat
completion), ``unparseable`` when the judge's answer holds no valid verdict. Both count as not passed. Only
programming errors raise (``TypeError``, ``ValueError``: wrong argument types or values). ``load_reference``
raises the suite errors of ``services.errors``.

The API key is held as a ``SecretStr``, sent as a bearer token and removed from every reason, raw answer and
log line (even when a server echoes it).
"""

import email.utils
import hashlib
import json
import logging
import math
import random
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator

from services.errors import SuiteError, TaskNotFoundError
from services.redaction import redact

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 120.0
"""Seconds one request to the judge may take (read, write and pool); the connect timeout is separate."""

DEFAULT_CONNECT_TIMEOUT_S = 10.0
"""Seconds to open a connection to the judge endpoint."""

DEFAULT_RETRIES = 3
"""Retries after a connection error, a timeout, 408/409/429 or 5xx; so at most four requests per format."""

DEFAULT_BACKOFF_S = 1.0
"""The first backoff; it doubles with each retry, times a random factor in [0.5, 1.5) (jitter)."""

DEFAULT_MAX_BACKOFF_S = 30.0
"""The longest backoff between two retries, and the longest Retry-After that is honoured."""

DEFAULT_TEMPERATURE = 0.0
"""The judge's sampling temperature: a grade should not depend on the dice."""

DEFAULT_MAX_TOKENS = 1000
"""The judge's answer budget (PyBench's evaluator used 1000)."""

DEFAULT_MAX_TRAJECTORY_CHARS = 16_000
"""The rendered size of one trajectory in a prompt; the middle is cut, the opening and the final answer kept."""

DEFAULT_MAX_MESSAGE_CHARS = 3_000
"""The rendered size of one message (an assistant reply or a code-interpreter output) in a prompt."""

MAX_QUERY_CHARS = 4_000
"""The rendered size of the user's query in a prompt."""

MAX_RAW_ANSWER_CHARS = 4_000
"""The judge's raw answer kept in a judgment."""

MAX_REASON_CHARS = 1_000
"""The reason kept in a judgment."""

CODE_INTERPRETER_PREFIX = "[INFO]This is a Code Interpreter Message:"
"""PyBench's prefix of the user messages that carry a code cell's output."""

_RETRY_STATUS = frozenset({408, 409, 429})
"""Statuses retried besides every 5xx (as the OpenAI SDK does)."""

_FORMAT_REJECTED_STATUS = frozenset({400, 422})
"""Statuses that make the judge try the next, simpler response format."""


ABSOLUTE_SYSTEM_PROMPT = """\
You are a strict reviewer of a code-interpreter agent. The agent received a user query and input files under \
./data, wrote Python code that ran cell by cell in a Jupyter notebook, saw each cell's output, and ended with \
an answer. You see the query and the agent's trajectory: its messages and the code interpreter's outputs \
(long parts are cut).

Decide whether the trajectory fulfils the user query:
- the code that matters ran without an unresolved error;
- every output the query asks for was produced (files saved where asked, usually under ./output);
- the final answer is correct, complete and supported by the interpreter's outputs; claims that the outputs \
do not support do not count.
Saving images with plt.savefig or cv2.imwrite are both fine. Length and style are not quality.

Think briefly, then answer with one JSON object and nothing else, in this form:
{"reason": "<at most three sentences>", "passed": true or false}
"""
"""The system prompt of ``absolute`` mode."""

ABSOLUTE_USER_TEMPLATE = """\
## User query
{query}

## Agent's trajectory
{trajectory}

Does this trajectory fulfil the user query? Answer with the JSON object only."""
"""The user prompt of ``absolute`` mode: ``query`` and ``trajectory`` (rendered by ``render_trajectory``)."""

PAIRWISE_SYSTEM_PROMPT = """\
You are a code reviewer comparing two agents' trajectories on the same task. Both agents received the same \
user query and the same input files under ./data, wrote Python code that ran cell by cell in a Jupyter \
notebook, saw each cell's output, and ended with an answer. You see the query and both trajectories: the \
messages and the code interpreter's outputs (long parts are cut).

Evaluate each agent on its own:
- Pass: the code that matters ran without an unresolved error and the trajectory fulfils the user query \
(the requested files were saved, the final answer is correct and supported by the outputs); otherwise Failed;
- reasoning quality: did it analyse the query and the code feedback correctly?
- code quality: is the code correct, and does it fulfil the query?
Then decide which solution is better, or "tie" when neither is. The order in which the agents are shown \
means nothing, and length is not quality. Saving images with plt.savefig or cv2.imwrite are both fine.

Think briefly, then answer with one JSON object and nothing else, in this form:
{"reason": "<at most three sentences>", "agent1_passed": true or false, "agent2_passed": true or false, \
"better": "agent1" or "agent2" or "tie"}
"""
"""The system prompt of ``pairwise`` mode (after PyBench's win/lose evaluator: a pass per agent, then a decision)."""

PAIRWISE_USER_TEMPLATE = """\
## User query
{query}

## Agent 1's trajectory
{reference}

## Agent 2's trajectory
{candidate}

Evaluate both agents and decide which solution is better. Answer with the JSON object only."""
"""The user prompt of ``pairwise`` mode: ``query``, ``reference`` (Agent 1) and ``candidate`` (Agent 2)."""

ABSOLUTE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"reason": {"type": "string"}, "passed": {"type": "boolean"}},
    "required": ["reason", "passed"],
    "additionalProperties": False,
}
"""The JSON schema of an ``absolute`` answer, sent as structured output (strict)."""

PAIRWISE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "reason": {"type": "string"},
        "agent1_passed": {"type": "boolean"},
        "agent2_passed": {"type": "boolean"},
        "better": {"type": "string", "enum": ["agent1", "agent2", "tie"]},
    },
    "required": ["reason", "agent1_passed", "agent2_passed", "better"],
    "additionalProperties": False,
}
"""The JSON schema of a ``pairwise`` answer, sent as structured output (strict)."""


class JudgeMode(StrEnum):
    ABSOLUTE = "absolute"
    PAIRWISE = "pairwise"


class JudgmentStatus(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    UNPARSEABLE = "unparseable"
    """The judge answered, but not with a valid verdict."""
    ERROR = "error"
    """No usable answer came back from the judge endpoint."""


class Preference(StrEnum):
    """Pairwise: which trajectory the judge found better."""

    CANDIDATE = "candidate"
    REFERENCE = "reference"
    TIE = "tie"


class ResponseFormat(StrEnum):
    """How the judge asks for JSON, from the most to the least constrained."""

    JSON_SCHEMA = "json_schema"
    JSON_OBJECT = "json_object"
    PROMPT = "prompt"
    """No ``response_format``: the prompt alone asks for JSON."""


_FALLBACK = {ResponseFormat.JSON_SCHEMA: ResponseFormat.JSON_OBJECT, ResponseFormat.JSON_OBJECT: ResponseFormat.PROMPT}


class Judgment(BaseModel):
    """The judge's grade of one trajectory. ``unparseable`` and ``error`` judgments count as not passed."""

    mode: JudgeMode
    status: JudgmentStatus
    reason: str = ""
    """The judge's reason; for ``unparseable`` and ``error``, what went wrong."""
    judge_model: str
    prompt_hash: str
    """sha256 of the mode and its prompt templates (``prompt_hash``): judgments compare only under one hash."""
    raw_answer: str = ""
    """The judge's answer as it came, cut to ``MAX_RAW_ANSWER_CHARS``."""
    latency_s: float = 0.0
    """Wall time of the whole judgment, retries and format fallbacks included."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    attempts: int = 0
    """HTTP requests sent (retries and format fallbacks included)."""
    response_format: ResponseFormat | None = None
    """The format of the request that got the answer; None when none did."""
    preference: Preference | None = None
    """Pairwise: which trajectory is better; None in absolute mode or without a valid verdict."""
    reference_passed: bool | None = None
    """Pairwise: the judge's pass of the reference trajectory."""
    judged_at: datetime = Field(default_factory=lambda: datetime.now(UTC))

    @property
    def passed(self) -> bool:
        return self.status == JudgmentStatus.PASSED

    @property
    def at_least_as_good(self) -> bool | None:
        """Pairwise: the candidate is better than the reference or ties with it; None without a preference."""
        return None if self.preference is None else self.preference != Preference.REFERENCE


class _AbsoluteAnswer(BaseModel):
    reason: str = ""
    passed: bool

    @field_validator("passed", mode="before")
    @classmethod
    def _pass_words(cls, value: Any) -> Any:
        return _pass_word(value)


class _PairwiseAnswer(BaseModel):
    reason: str = ""
    agent1_passed: bool
    agent2_passed: bool
    better: Literal["agent1", "agent2", "tie"]

    @field_validator("agent1_passed", "agent2_passed", mode="before")
    @classmethod
    def _pass_words(cls, value: Any) -> Any:
        return _pass_word(value)

    @field_validator("better", mode="before")
    @classmethod
    def _agent_name(cls, value: Any) -> Any:
        return re.sub(r"[\s_-]", "", value.lower()) if isinstance(value, str) else value


def _pass_word(value: Any) -> Any:
    """Accept PyBench's own labels ("Pass" / "Failed") besides JSON booleans."""
    if isinstance(value, str):
        word = value.strip().lower()
        if word in ("pass", "passed"):
            return True
        if word in ("fail", "failed"):
            return False
    return value


@dataclass(frozen=True)
class _Prompt:
    system: str
    user_template: str
    schema_name: str
    schema: dict[str, Any]
    answer: type[BaseModel]


_PROMPTS = {
    JudgeMode.ABSOLUTE: _Prompt(
        ABSOLUTE_SYSTEM_PROMPT, ABSOLUTE_USER_TEMPLATE, "absolute_judgment", ABSOLUTE_SCHEMA, _AbsoluteAnswer
    ),
    JudgeMode.PAIRWISE: _Prompt(
        PAIRWISE_SYSTEM_PROMPT, PAIRWISE_USER_TEMPLATE, "pairwise_judgment", PAIRWISE_SCHEMA, _PairwiseAnswer
    ),
}


def prompt_hash(mode: JudgeMode | str) -> str:
    """Return the sha256 (hex) of ``mode`` and its prompt templates.

    Raises:
        ValueError: not a mode.
    """
    mode = JudgeMode(mode)
    prompt = _PROMPTS[mode]
    return hashlib.sha256(f"{mode.value}\n{prompt.system}\n{prompt.user_template}".encode()).hexdigest()


def shorten(text: str, limit: int, head_share: float = 0.5) -> str:
    """Return ``text`` cut to at most ``limit`` characters (for ``limit`` >= 40): its head and tail, with a mark.

    ``head_share`` is the part of the room given to the head; the tail gets the rest.
    """
    if len(text) <= limit:
        return text
    mark = "\n[... {} characters cut ...]\n"
    room = max(limit - len(mark.format(len(text))), 0)
    head = int(room * head_share)
    tail = room - head
    return text[:head] + mark.format(len(text) - head - tail) + (text[len(text) - tail :] if tail else "")


def _message_parts(message: Any) -> tuple[str, str]:
    """Return ``(role, content)`` of a ``{"role", "content"}`` mapping or an object with those attributes.

    Raises:
        TypeError: neither, or a role or content of the wrong type.
    """
    if isinstance(message, Mapping):
        role, content = message.get("role"), message.get("content")
    elif hasattr(message, "role") and hasattr(message, "content"):
        role, content = message.role, message.content
    else:
        raise TypeError(f"a message is a mapping with 'role' and 'content', not {type(message).__name__}")
    if not isinstance(role, str):
        raise TypeError(f"a message's role is a string, not {type(role).__name__}")
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise TypeError(f"a message's content is a string or None, not {type(content).__name__}")
    return role, content


def render_trajectory(
    messages: Sequence[Any],
    *,
    query: str | None = None,
    max_chars: int = DEFAULT_MAX_TRAJECTORY_CHARS,
    max_message_chars: int = DEFAULT_MAX_MESSAGE_CHARS,
) -> str:
    """Render a trajectory's messages compactly for a judge prompt, in at most ``max_chars`` characters.

    System messages are left out, and so is the user message that equals ``query`` (the prompt shows it).
    Each assistant message and code-interpreter output is cut to ``max_message_chars``; when the whole is
    still too long its middle is cut, keeping a third of the room for the opening and the rest for the end,
    where the final answer is.

    Raises:
        TypeError: a message is not a ``{"role", "content"}`` mapping (or an object with those attributes).
        ValueError: a limit below 200 characters.
    """
    if max_chars < 200 or max_message_chars < 200:
        raise ValueError("max_chars and max_message_chars must be at least 200")
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise TypeError(f"messages is a sequence of messages, not {type(messages).__name__}")
    wanted_query = query.strip() if query is not None else None
    blocks: list[str] = []
    turn = 0
    for message in messages:
        role, content = _message_parts(message)
        if role == "system":
            continue
        if role == "assistant":
            turn += 1
            title = f"### Assistant (turn {turn})"
        elif role == "user" and content.startswith(CODE_INTERPRETER_PREFIX):
            title = "### Code interpreter output"
            content = content[len(CODE_INTERPRETER_PREFIX) :]
        elif role == "user":
            if wanted_query is not None and content.strip() == wanted_query:
                continue
            title = "### User"
        else:
            title = f"### {role.capitalize()}"
        blocks.append(f"{title}\n{shorten(content.strip(), max_message_chars)}")
    if not blocks:
        return "(no messages: the agent produced no trajectory)"
    return shorten("\n\n".join(blocks), max_chars, head_share=1 / 3)


def _strip_thinking(text: str) -> str:
    return re.sub(r"<think>.*?</think>", "", text, flags=re.DOTALL | re.IGNORECASE)


_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)


def _json_objects(text: str) -> Iterator[dict[str, Any]]:
    """Yield the JSON objects in ``text``: the whole text, then fenced blocks, then any object in the prose."""
    text = _strip_thinking(text).strip()
    decoder = json.JSONDecoder()
    pieces = [text, *(match.group(1).strip() for match in _FENCE.finditer(text))]
    for piece in pieces:
        try:
            value = json.loads(piece)
        except ValueError:
            continue
        if isinstance(value, dict):
            yield value
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(value, dict):
            yield value


def extract_json_object(text: str) -> dict[str, Any] | None:
    """Return the first JSON object in ``text`` (bare, in a ```json fence, or amid prose), or None."""
    return next(_json_objects(text), None)


@dataclass
class _Exchange:
    """What came back from the endpoint for one judgment."""

    response: httpx.Response | None = None
    error: str | None = None
    attempts: int = 0
    response_format: ResponseFormat | None = None
    notes: list[str] = field(default_factory=list)


def _retry_after_s(value: str | None) -> float | None:
    """Seconds a Retry-After header asks to wait (delta-seconds or an HTTP date); None when absent or invalid."""
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
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - datetime.now(UTC)).total_seconds(), 0.0)


class Judge:
    """An LLM judge on an OpenAI-compatible chat-completions endpoint (``{base_url}/chat/completions``).

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
            retries: retries after a connection error, a timeout, 408/409/429 or 5xx.
            backoff_s: the first backoff, doubled at each retry, with jitter; ``max_backoff_s`` caps it and
                the Retry-After that is honoured.
            temperature, max_tokens: the judge's sampling.
            max_trajectory_chars: the rendered size of each trajectory in a prompt.
            response_format: the first format to ask for; the judge falls back from it when rejected.
            transport: an httpx transport (tests, proxies); the default opens real connections.

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
        if retries < 0 or backoff_s < 0 or max_backoff_s < 0 or timeout_s <= 0 or connect_timeout_s <= 0:
            raise ValueError("retries and backoffs must be >= 0, timeouts > 0")
        if max_tokens <= 0 or max_trajectory_chars < 200:
            raise ValueError("max_tokens must be > 0 and max_trajectory_chars >= 200")
        self.model = model
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.max_trajectory_chars = max_trajectory_chars
        self._format = ResponseFormat(response_format)
        self._secret = api_key.get_secret_value() if api_key is not None else ""
        headers = {"Authorization": f"Bearer {self._secret}"} if self._secret else {}
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            transport=transport,
            follow_redirects=False,
        )

    def __repr__(self) -> str:
        return f"Judge(base_url={str(self._http.base_url)!r}, model={self.model!r}, format={self._format.value!r})"

    def __enter__(self) -> "Judge":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

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
            reference: the reference's messages (e.g. ``load_reference(...).messages``).

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

    def _redact(self, text: str) -> str:
        return redact(text, self._secret)

    def _snippet(self, text: str, limit: int) -> str:
        """The redacted start of ``text`` (redacted first, so that a cut never leaves part of the key)."""
        return self._redact(text)[:limit]

    def _judge(self, mode: JudgeMode, user: str) -> Judgment:
        prompt = _PROMPTS[mode]
        started = time.monotonic()
        exchange = self._exchange(prompt, user)
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
        judgment.reason = shorten(self._redact(judgment.reason), MAX_REASON_CHARS)
        judgment.raw_answer = shorten(self._redact(judgment.raw_answer), MAX_RAW_ANSWER_CHARS)
        if judgment.status in (JudgmentStatus.ERROR, JudgmentStatus.UNPARSEABLE):
            logger.warning("judge %s, %s mode: %s: %s", self.model, mode.value, judgment.status.value, judgment.reason)
        return judgment

    def _read(self, exchange: _Exchange, prompt: _Prompt, judgment: Judgment) -> None:
        """Fill ``judgment`` from the endpoint's answer (status, reason, tokens, raw answer)."""
        response = exchange.response
        if response is None:
            judgment.reason = exchange.error or "no answer"
            return
        if response.status_code != 200:
            judgment.reason = " ".join(
                [
                    *exchange.notes,
                    f"judge endpoint answered HTTP {response.status_code}: {self._snippet(response.text, 300)}",
                ]
            )
            return
        try:
            payload = response.json()
            choice = payload["choices"][0]
            content = choice["message"].get("content")
            usage = payload.get("usage") or {}
            judgment.prompt_tokens = _token_count(usage.get("prompt_tokens"))
            judgment.completion_tokens = _token_count(usage.get("completion_tokens"))
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            judgment.reason = f"judge endpoint's answer is not a chat completion: {self._snippet(response.text, 300)}"
            return
        text = content if isinstance(content, str) else ""
        judgment.raw_answer = text
        judgment.status = JudgmentStatus.UNPARSEABLE
        if not text.strip():
            judgment.reason = f"the judge's answer is empty (finish_reason {choice.get('finish_reason')!r})"
            return
        first_error: ValidationError | None = None
        for candidate in _json_objects(text):
            try:
                answer = prompt.answer.model_validate(candidate)
            except ValidationError as exc:
                first_error = first_error or exc
                continue
            _apply(answer, judgment)
            return
        if first_error is None:
            judgment.reason = "no JSON object in the judge's answer"
        else:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in first_error.errors()[:4])
            judgment.reason = f"the judge's JSON is not a verdict ({problems})"

    def _exchange(self, prompt: _Prompt, user: str) -> _Exchange:
        """Ask the endpoint, falling back to simpler response formats while the server rejects the format."""
        exchange = _Exchange()
        level = self._format
        messages = [{"role": "system", "content": prompt.system}, {"role": "user", "content": user}]
        while True:
            body: dict[str, Any] = {
                "model": self.model,
                "messages": messages,
                "temperature": self.temperature,
                "max_tokens": self.max_tokens,
            }
            if level == ResponseFormat.JSON_SCHEMA:
                body["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": prompt.schema_name, "strict": True, "schema": prompt.schema},
                }
            elif level == ResponseFormat.JSON_OBJECT:
                body["response_format"] = {"type": "json_object"}
            self._post(body, exchange)
            response = exchange.response
            if response is not None and _rejects_format(response) and level in _FALLBACK:
                exchange.notes.append(f"response_format {level.value} got HTTP {response.status_code};")
                logger.info(
                    "judge endpoint %s rejected response_format %s (HTTP %d): trying %s",
                    self._http.base_url,
                    level.value,
                    response.status_code,
                    _FALLBACK[level].value,
                )
                level = _FALLBACK[level]
                continue
            if response is not None and response.status_code == 200:
                exchange.response_format = level
                if level != self._format:
                    logger.info("judge endpoint %s: using response_format %s from now on", self._http.base_url, level)
                    self._format = level
            return exchange

    def _post(self, body: dict[str, Any], exchange: _Exchange) -> None:
        """POST one request with retries; set ``exchange.response`` (any final status) or ``exchange.error``."""
        exchange.response = None
        exchange.error = None
        for attempt in range(self.retries + 1):
            exchange.attempts += 1
            wait: float | None = None
            try:
                response = self._http.post("/chat/completions", json=body)
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}"
                if attempt == self.retries:
                    exchange.error = (
                        f"judge endpoint {self._http.base_url} did not answer after {attempt + 1} attempts "
                        f"({problem}); check that it is up and reachable from the grader"
                    )
                    return
            else:
                if (response.status_code not in _RETRY_STATUS and response.status_code < 500) or (
                    "response_format" in body and _rejects_format(response)
                ):
                    exchange.response = response
                    return
                problem = f"HTTP {response.status_code}"
                if attempt == self.retries:
                    exchange.error = (
                        f"judge endpoint {self._http.base_url} answered {problem} {attempt + 1} times "
                        f"(last: {self._snippet(response.text, 200)}); is it overloaded or down?"
                    )
                    return
                wait = _retry_after_s(response.headers.get("retry-after"))
            if wait is None:
                wait = self.backoff_s * (2**attempt) * (0.5 + random.random())
            wait = min(wait, self.max_backoff_s)
            logger.warning(
                "judge endpoint %s: %s; retry %d of %d in %.2f s",
                self._http.base_url,
                problem,
                attempt + 1,
                self.retries,
                wait,
            )
            time.sleep(wait)


def _rejects_format(response: httpx.Response) -> bool:
    """Whether an answer refuses the request's ``response_format``: 400 or 422, or an error status whose body
    names it (a server error that would only repeat itself when retried)."""
    if response.status_code in _FORMAT_REJECTED_STATUS:
        return True
    return response.status_code >= 400 and "response_format" in response.text[:4000]


def _token_count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _apply(answer: BaseModel, judgment: Judgment) -> None:
    """Set the judgment's verdict from a validated answer."""
    if isinstance(answer, _AbsoluteAnswer):
        judgment.status = JudgmentStatus.PASSED if answer.passed else JudgmentStatus.FAILED
        judgment.reason = answer.reason
    elif isinstance(answer, _PairwiseAnswer):
        judgment.status = JudgmentStatus.PASSED if answer.agent2_passed else JudgmentStatus.FAILED
        judgment.reason = answer.reason
        judgment.reference_passed = answer.agent1_passed
        judgment.preference = {
            "agent1": Preference.REFERENCE,
            "agent2": Preference.CANDIDATE,
            "tie": Preference.TIE,
        }[answer.better]
    else:  # pragma: no cover - the two answer models are the only ones
        raise TypeError(f"unknown answer type {type(answer).__name__}")


@dataclass(frozen=True)
class Reference:
    """A recorded trajectory of one task, to judge candidates against."""

    task_index: int
    query: str
    messages: list[dict[str, str]]


def load_reference(path: str | Path, task_index: int) -> Reference:
    """Return the recorded trajectory of task ``task_index`` from a PyBench ``trajectory.jsonl``.

    Each line is one JSON object: ``messages`` plus the task's fields (``index``, ``user`` the query, ...).
    Lines are read until the task's line; when a task has several, the first wins.

    Raises:
        SuiteError: the file cannot be read, or a line before the task's is not a recorded trajectory.
        TaskNotFoundError: no line records that task (PyBench's file has 135 of the 143 tasks).
    """
    path = Path(path)
    try:
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                    index = int(record["index"])
                except (ValueError, KeyError, TypeError) as exc:
                    raise SuiteError(f"{path}, line {number}: not a recorded trajectory ({exc})") from exc
                if index == task_index:
                    return _reference(record, index, path, number)
    except OSError as exc:
        raise SuiteError(f"cannot read recorded trajectories at {path}: {exc}") from exc
    raise TaskNotFoundError(f"{path} records no trajectory of task {task_index}; judge it in absolute mode")


def _reference(record: dict[str, Any], index: int, path: Path, number: int) -> Reference:
    """Raises: SuiteError: the record's messages are malformed."""
    try:
        messages = [{"role": str(m["role"]), "content": str(m.get("content") or "")} for m in record["messages"]]
    except (KeyError, TypeError) as exc:
        raise SuiteError(f"{path}, line {number}: the messages are malformed ({exc})") from exc
    query = record.get("user")
    if not isinstance(query, str) or not query.strip():
        query = next(
            (m["content"] for m in messages if m["role"] == "user" and not m["content"].startswith("[INFO]")), ""
        )
    return Reference(task_index=index, query=query.strip(), messages=messages)
