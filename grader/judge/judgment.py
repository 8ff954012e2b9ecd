"""Reading the judge model's answer into a ``services.verdict.Judgment``.

The answer should be one JSON object; it is looked for in the whole text, then in fenced blocks, then anywhere
in the prose (after dropping ``<think>`` blocks), and the first object that validates against the mode's answer
schema gives the verdict. An answer without one makes the judgment ``unparseable``, with what was wrong.
"""

import functools
import itertools
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

from pydantic import BaseModel, ValidationError

from grader.judge.prompts import AbsoluteAnswer, PairwiseAnswer, Prompt
from services.verdict import Judgment, JudgmentStatus, Preference

_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)

_PREFERENCES = {"agent1": Preference.REFERENCE, "agent2": Preference.CANDIDATE, "tie": Preference.TIE}
"""Pairwise: the answer's ``better`` (Agent 1 is the reference, Agent 2 the candidate) as a preference."""


MAX_FENCES = 16
"""Fenced blocks of an answer tried as JSON; the rest are ignored."""

MAX_OBJECT_STARTS = 64
"""Places in the prose (each a ``{``) where an object is tried; the rest are ignored. Each try reads at most the
answer's length, so reading an answer costs at most this many times its length: linear, whatever the judge sends
(the endpoint client caps the answer's bytes)."""

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


def _strip_thinking(text: str) -> str:
    """``text`` without its closed ``<think>...</think>`` blocks (any case); an unclosed one stays, with all after
    it. One pass: each block's end is looked for once, and the first block without one ends the search (a regular
    expression read to the end from every unclosed block, which took minutes on 150,000 of them)."""
    lowered = text.lower()
    kept: list[str] = []
    position = 0
    while (start := lowered.find(_THINK_OPEN, position)) >= 0:
        end = lowered.find(_THINK_CLOSE, start + len(_THINK_OPEN))
        if end < 0:
            break
        kept.append(text[position:start])
        position = end + len(_THINK_CLOSE)
    kept.append(text[position:])
    return "".join(kept)


def _as_object(decode: Callable[[], Any]) -> dict[str, Any] | None:
    """What ``decode`` returns if it is a JSON object; None when it is not one or is not JSON at all (nesting too
    deep for the decoder included)."""
    try:
        value = decode()
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _decode_at(decoder: json.JSONDecoder, text: str, start: int) -> Any:
    """The JSON value that begins at ``start`` of ``text``. Raises ValueError (not JSON) or RecursionError."""
    return decoder.raw_decode(text, start)[0]


def _json_objects(text: str) -> Iterator[dict[str, Any]]:
    """Yield the JSON objects in ``text``: the whole text, then fenced blocks (at most ``MAX_FENCES``), then
    objects in the prose (tried at the first ``MAX_OBJECT_STARTS`` braces)."""
    text = _strip_thinking(text).strip()
    decoder = json.JSONDecoder()
    fences = (match.group(1).strip() for match in _FENCE.finditer(text))
    for piece in itertools.chain([text], itertools.islice(fences, MAX_FENCES)):
        if (value := _as_object(functools.partial(json.loads, piece))) is not None:
            yield value
    start = text.find("{")
    for _ in range(MAX_OBJECT_STARTS):
        if start < 0:
            return
        if (value := _as_object(functools.partial(_decode_at, decoder, text, start))) is not None:
            yield value
        start = text.find("{", start + 1)


def extract_json_object(text: str) -> dict[str, Any] | None:
    """Return the first JSON object in ``text`` (bare, in a ```json fence, or amid prose), or None."""
    return next(_json_objects(text), None)


def read_answer(text: str, finish_reason: str | None, prompt: Prompt, judgment: Judgment) -> None:
    """Set ``judgment``'s raw answer, status and reason from the judge's answer ``text``: ``passed`` or ``failed``
    from the first JSON object that fits ``prompt``'s schema, else ``unparseable`` with what was wrong (uncut: the
    judge cuts both). Raises nothing."""
    judgment.raw_answer = text
    judgment.status = JudgmentStatus.UNPARSEABLE
    if not text.strip():
        judgment.reason = f"the judge's answer is empty (finish_reason {finish_reason!r})"
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


def _apply(answer: BaseModel, judgment: Judgment) -> None:
    """Set the judgment's verdict from a validated answer."""
    if isinstance(answer, AbsoluteAnswer):
        judgment.status = JudgmentStatus.PASSED if answer.passed else JudgmentStatus.FAILED
        judgment.reason = answer.reason
    elif isinstance(answer, PairwiseAnswer):
        judgment.status = JudgmentStatus.PASSED if answer.agent2_passed else JudgmentStatus.FAILED
        judgment.reason = answer.reason
        judgment.reference_passed = answer.agent1_passed
        judgment.preference = _PREFERENCES[answer.better]
    else:  # pragma: no cover - the two answer models are the only ones
        raise TypeError(f"unknown answer type {type(answer).__name__}")
