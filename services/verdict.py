"""Verdict schemas: the grade of one task session, and the metrics of an evaluation."""

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

from services.trajectory import Trajectory


class VerdictStatus(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    INFRA_ERROR = "infra_error"
    """The environment broke (sandbox died, model endpoint unreachable): not the agent's fault."""
    UNAVAILABLE = "unavailable"
    """The task's input files are not in this copy of the suite: it was not run."""
    UNGRADABLE = "ungradable"
    """The task ran but its checks cannot be evaluated here (e.g. a check kind not implemented yet)."""


class CheckResult(BaseModel):
    kind: str
    passed: bool | None
    """True or False when the check ran; None when it could not be evaluated."""
    detail: str = ""


class GradingOutcome(BaseModel):
    """The outcome of one grading of a session (see ``grader.variants``)."""

    status: VerdictStatus
    checks: list[CheckResult] = Field(default_factory=list)
    reason: str = ""


class JudgeMode(StrEnum):
    ABSOLUTE = "absolute"
    """Does the trajectory fulfil the user's query?"""
    PAIRWISE = "pairwise"
    """The trajectory against the suite's recorded trajectory of the task (PyBench's mode)."""


class JudgmentStatus(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    UNPARSEABLE = "unparseable"
    """The judge answered, but not with a valid verdict."""
    ERROR = "error"
    """No usable answer came back from the judge endpoint (or it was never asked: a refused endpoint, a lost key)."""


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


class Judgment(BaseModel):
    """The LLM judge's grade of a session, as ``grader.judge`` made it and as its verdict stores it, whole.
    ``unparseable`` and ``error`` count as not passed, and stay in every denominator.

    The JSON names of the first nine fields are those verdicts were stored with before the other fields were
    added; a stored judgment without the later fields reads with their defaults.
    """

    mode: JudgeMode
    status: JudgmentStatus
    reason: str = ""
    """The judge's reason; for ``unparseable`` and ``error``, what went wrong."""
    judge_model: str
    prompt_hash: str
    """sha256 of the mode and its prompt templates (``grader.judge.prompt_hash``): judgments compare only under
    one hash."""
    preference: Preference | None = None
    """Pairwise: which trajectory is better; None in absolute mode or without a valid verdict."""
    latency_s: float = 0.0
    """Wall time of the whole judgment, retries and format fallbacks included."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    raw_answer: str = ""
    """The judge's answer as it came (the API key cut out), cut to ``grader.judge.MAX_RAW_ANSWER_CHARS``."""
    attempts: int = 0
    """HTTP requests sent (retries and format fallbacks included)."""
    response_format: ResponseFormat | None = None
    """The format of the request that got the answer; None when none did."""
    reference_passed: bool | None = None
    """Pairwise: the judge's pass of the reference trajectory."""
    judged_at: datetime | None = None
    """When the judgment was made; None in judgments stored before it was recorded."""

    @property
    def passed(self) -> bool:
        return self.status == JudgmentStatus.PASSED

    @property
    def at_least_as_good(self) -> bool | None:
        """Pairwise: the candidate is better than the reference or ties with it; None without a preference."""
        return None if self.preference is None else self.preference != Preference.REFERENCE


class Verdict(BaseModel):
    """The grade of one task session.

    ``status``, ``checks`` and ``reason`` are the ``original`` grading: PyBench's own tests, bugs included, so
    pass rates compare with the paper's. ``fixed`` is the grading that follows each task's intent.
    """

    evaluation_id: str
    task_index: int
    attempt: int
    grading: int = 1
    """Which grading of the evaluation made it (``POST .../regrade`` makes another; earlier ones stay in the store
    as ``verdict-grading-<n>.json``)."""
    grader_version: str | None = Field(
        default=None,
        description="The service version (<version>+<commit>) of the grader build that graded it; None for a verdict "
        "no grader made (an unavailable task, a job given up) or one stored before versions were recorded.",
    )
    checks_hash: str | None = Field(
        default=None,
        description="sha256 of the checks it was graded with: the check code's version and every task of the suite "
        "with what each grading applies to it (grader.grading.checks_hash). Verdicts with one hash were graded alike.",
    )
    checks_version: int | None = Field(
        default=None,
        description="The check code's version inside that hash (grader.grading.CHECKS_VERSION), bumped whenever "
        "the meaning of a check changes.",
    )
    paper_category: str
    status: VerdictStatus
    checks: list[CheckResult] = Field(default_factory=list)
    reason: str = ""
    fixed: GradingOutcome | None = None
    judgment: Judgment | None = None
    """The LLM judge's grade, when the evaluation asked for a judge."""
    turns: int = 0
    prompt_tokens: int | None = None
    """The session's prompt tokens over its turns, as the endpoint reported them (None: it reported none)."""
    completion_tokens: int | None = None
    replayed_turns: int = 0
    """Turns of the session replayed from the reply cache (model calls an earlier attempt had paid for)."""
    replayed_tokens: int = 0
    """The prompt and completion tokens of those turns: not paid again."""
    sandbox_id: str | None = None
    retryable: bool = False
    """An ``infra_error`` that running the session again may mend by itself (``EndReason.retryable``); the
    lifecycle runs such a session again as its next attempt, up to ``services.lifecycle.MAX_ATTEMPTS``."""
    graded_at: datetime = Field(default_factory=lambda: datetime.now(UTC))


class CategoryMetrics(BaseModel):
    tasks: int
    passed: int
    pass_rate: float
    """Passed over every task of the category."""
    gradable: int = 0
    """Tasks the grading could decide (passed or failed)."""
    pass_rate_gradable: float = 0.0
    """Passed over the gradable tasks of the category."""


class GradingMetrics(BaseModel):
    """Pass rates of one grading (``original`` or ``fixed``)."""

    tasks: int
    passed: int
    pass_rate: float
    """Passed over every task of the evaluation, as the paper divides by all 143."""
    gradable: int
    pass_rate_gradable: float
    """Passed over the tasks this grading could decide (not unavailable, ungradable or broken by infra)."""
    per_category: dict[str, CategoryMetrics]
    by_status: dict[VerdictStatus, int]


class AgreementMatrix(BaseModel):
    """The LLM judge against the unit tests (the ``fixed`` grading) on the tasks both decided."""

    both_passed: int = 0
    tests_only: int = 0
    """The tests passed the task, the judge did not."""
    judge_only: int = 0
    """The judge passed the task, the tests did not."""
    both_failed: int = 0
    disagreeing: list[int] = Field(default_factory=list)
    """The tasks where the two differ."""


class JudgeMetrics(BaseModel):
    """Pass Rate LLM: the judge's passes over every task of the evaluation."""

    judged: int
    passed: int
    pass_rate: float
    """Judged passed over every task (unjudged, unparseable and failed judgments count as not passed)."""
    unparseable: int
    errors: int
    per_category: dict[str, CategoryMetrics]
    agreement: dict[str, AgreementMatrix]
    """Per paper category, and ``all``."""


class Metrics(BaseModel):
    """PyBench's figures for one evaluation.

    The top-level pass rates are the ``original`` grading's (PyBench's own tests, comparable with the paper);
    ``fixed`` holds the same figures under the grading that follows each task's intent.
    """

    tasks: int
    passed: int
    pass_rate: float
    """Passed over all tasks of the evaluation (unavailable and infra-failed tasks count as not passed)."""
    gradable: int = 0
    pass_rate_gradable: float = 0.0
    per_category: dict[str, CategoryMetrics]
    avg_turns: float
    """Mean number of assistant turns over the tasks that ran (passed or failed)."""
    prompt_tokens: int = 0
    """Prompt tokens over every task's session (those the endpoint reported)."""
    completion_tokens: int = 0
    cost_usd: float | None = None
    """What the tokens cost at the prices the submission gave (USD per million tokens); None without prices."""
    model_calls_saved: int = 0
    """Turns replayed from the reply cache in retried sessions: model calls not made again."""
    tokens_saved: int = 0
    """The prompt and completion tokens of those turns."""
    avg_turns_paper: float = 0.0
    """The paper's average turns: a failed task counts as 10 turns, a passed one its own count (passed by the
    judge when there is one, else by the tests)."""
    by_status: dict[VerdictStatus, int]
    fixed: GradingMetrics | None = None
    llm: JudgeMetrics | None = None
    """Present when the evaluation had an LLM judge."""


class Results(BaseModel):
    """The answer of ``GET /v1/evaluations/{id}/results``."""

    evaluation_id: str
    complete: bool
    verdicts: list[Verdict]
    metrics: Metrics
    statistics: dict[str, Any] = Field(default_factory=dict)
    """Per grading (``original``, ``fixed``, and ``judge`` when judged), over the suite (``all``) and per category:
    the mean pass rate over the tasks the grading decided (infrastructure failures, unavailable and ungradable
    tasks left out of the denominator and counted as ``excluded``), its standard error clustered by task, a 95%
    confidence interval (``ci_low``, ``ci_high``), pass@k and pass^k (``services.results.estimates``;
    docs/protocol.md)."""


def session_verdict(trajectory: Trajectory, paper_category: str) -> Verdict:
    """The verdict of a session before its checks: what the session counted (turns, tokens, replayed turns, its
    sandbox), ``failed`` until graded; a session that ended on an infrastructure reason is an ``infra_error`` with
    that reason (``retryable`` as the reason is) and needs no grading. Raises nothing."""
    verdict = Verdict(
        evaluation_id=trajectory.evaluation_id,
        task_index=trajectory.task_index,
        attempt=trajectory.attempt,
        paper_category=paper_category,
        status=VerdictStatus.FAILED,
        turns=trajectory.assistant_turns,
        prompt_tokens=trajectory.prompt_tokens,
        completion_tokens=trajectory.completion_tokens,
        replayed_turns=trajectory.replayed_turns,
        replayed_tokens=trajectory.replayed_tokens,
        sandbox_id=trajectory.session.sandbox_id if trajectory.session else None,
    )
    if trajectory.end_reason.infra:
        reason = f"{trajectory.end_reason.value}: {trajectory.error or 'no detail'}"
        verdict.status, verdict.reason = VerdictStatus.INFRA_ERROR, reason
        verdict.retryable = trajectory.end_reason.retryable
        verdict.fixed = GradingOutcome(status=VerdictStatus.INFRA_ERROR, reason=reason)
    return verdict
