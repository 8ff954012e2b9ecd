"""The LLM judge: an OpenAI-compatible chat model grades a trajectory (PyBench's "Pass Rate (LLM)").

Two modes:

- ``absolute``: does the trajectory fulfil the user's query? The answer is passed or failed, with a reason.
- ``pairwise`` (the benchmark's mode): the judge sees a reference trajectory of the same task ("Agent 1", as in
  PyBench's evaluator) and the candidate ("Agent 2"), decides for each whether it passes, and which is better
  or a tie. The candidate's pass decides the judgment's status (what PyBench counts in its LLM pass rate); the
  comparison is kept as ``preference`` (win / tie / lose against the reference).

One module per job:

- ``prompts``: the prompts and answer schemas of each mode, and ``prompt_hash``;
- ``render``: a trajectory rendered compactly for a prompt;
- ``judgment``: the judge model's answer read into a ``services.verdict.Judgment`` (the one judgment type,
  stored whole in the verdict);
- ``client``: ``Judge``, which asks through ``services.endpoint.client`` with its response-format fallback;
- ``session``: the grader job's entry, ``judge_session`` and ``judge_key_lost``.

Failure contract: the judge returns an ``error`` or ``unparseable`` judgment for whatever the endpoint or the
judge model does, and raises only for programming errors (see ``client``). The API key is sent as a bearer
token and cut out of every reason, raw answer and log line (even when a server echoes it).
"""

from grader.judge.client import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    DEFAULT_TIMEOUT_S,
    MAX_QUERY_CHARS,
    MAX_RAW_ANSWER_CHARS,
    MAX_REASON_CHARS,
    Judge,
)
from grader.judge.judgment import extract_json_object
from grader.judge.prompts import (
    ABSOLUTE_SCHEMA,
    ABSOLUTE_SYSTEM_PROMPT,
    ABSOLUTE_USER_TEMPLATE,
    PAIRWISE_SCHEMA,
    PAIRWISE_SYSTEM_PROMPT,
    PAIRWISE_USER_TEMPLATE,
    prompt_hash,
)
from grader.judge.render import DEFAULT_MAX_MESSAGE_CHARS, DEFAULT_MAX_TRAJECTORY_CHARS, render_trajectory, shorten
from grader.judge.session import RECORDINGS, judge_key_lost, judge_session
from services.verdict import JudgeMode, Judgment, JudgmentStatus, Preference, ResponseFormat

__all__ = [
    "ABSOLUTE_SCHEMA",
    "ABSOLUTE_SYSTEM_PROMPT",
    "ABSOLUTE_USER_TEMPLATE",
    "DEFAULT_MAX_MESSAGE_CHARS",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_MAX_TRAJECTORY_CHARS",
    "DEFAULT_TEMPERATURE",
    "DEFAULT_TIMEOUT_S",
    "MAX_QUERY_CHARS",
    "MAX_RAW_ANSWER_CHARS",
    "MAX_REASON_CHARS",
    "PAIRWISE_SCHEMA",
    "PAIRWISE_SYSTEM_PROMPT",
    "PAIRWISE_USER_TEMPLATE",
    "RECORDINGS",
    "Judge",
    "JudgeMode",
    "Judgment",
    "JudgmentStatus",
    "Preference",
    "ResponseFormat",
    "extract_json_object",
    "judge_key_lost",
    "judge_session",
    "prompt_hash",
    "render_trajectory",
    "shorten",
]
