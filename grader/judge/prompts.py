"""The judge's prompts and the schemas of its answers, per mode.

``absolute``: does the trajectory fulfil the user's query? ``pairwise`` (after PyBench's win/lose evaluator): a
pass for the reference ("Agent 1") and for the candidate ("Agent 2"), then which is better. Each mode has a system
prompt, a user template, the JSON schema sent as structured output, and the pydantic model that validates an
answer (which accepts PyBench's own "Pass" / "Failed" besides JSON booleans). ``prompt_hash`` identifies a mode's
prompts: judgments compare only under one hash.
"""

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, field_validator

from services.verdict import JudgeMode

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


class AbsoluteAnswer(BaseModel):
    """A valid ``absolute`` answer."""

    reason: str = ""
    passed: bool

    @field_validator("passed", mode="before")
    @classmethod
    def _pass_words(cls, value: Any) -> Any:
        return _pass_word(value)


class PairwiseAnswer(BaseModel):
    """A valid ``pairwise`` answer: Agent 1 is the reference, Agent 2 the candidate."""

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
class Prompt:
    """One mode's prompts and answer schema."""

    system: str
    user_template: str
    schema_name: str
    schema: dict[str, Any]
    answer: type[BaseModel]


PROMPTS = {
    JudgeMode.ABSOLUTE: Prompt(
        ABSOLUTE_SYSTEM_PROMPT, ABSOLUTE_USER_TEMPLATE, "absolute_judgment", ABSOLUTE_SCHEMA, AbsoluteAnswer
    ),
    JudgeMode.PAIRWISE: Prompt(
        PAIRWISE_SYSTEM_PROMPT, PAIRWISE_USER_TEMPLATE, "pairwise_judgment", PAIRWISE_SCHEMA, PairwiseAnswer
    ),
}
"""The prompts and answer schema of each mode."""


def prompt_hash(mode: JudgeMode | str) -> str:
    """Return the sha256 (hex) of ``mode`` and its prompt templates.

    Raises:
        ValueError: not a mode.
    """
    mode = JudgeMode(mode)
    prompt = PROMPTS[mode]
    return hashlib.sha256(f"{mode.value}\n{prompt.system}\n{prompt.user_template}".encode()).hexdigest()
