"""Reading the judge model's answer into a ``services.verdict.Judgment``.

The answer should be one JSON object; it is looked for in the whole text, then in fenced blocks, then anywhere
in the prose (after dropping ``<think>`` blocks), and the first object that validates against the mode's answer
schema gives the verdict. An answer without one makes the judgment ``unparseable``, with what was wrong.
"""

import json
import re
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ValidationError

from grader.judge.prompts import AbsoluteAnswer, PairwiseAnswer, Prompt
from services.verdict import Judgment, JudgmentStatus, Preference

_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)

_PREFERENCES = {"agent1": Preference.REFERENCE, "agent2": Preference.CANDIDATE, "tie": Preference.TIE}
"""Pairwise: the answer's ``better`` (Agent 1 is the reference, Agent 2 the candidate) as a preference."""


def _strip_thinking(text: str) -> str:
    return re.sub(r"<think>.*?</think>", "", text, flags=re.DOTALL | re.IGNORECASE)


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
