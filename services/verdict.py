"""Verdict schemas: the grade of one task session, and the metrics of an evaluation."""

from datetime import UTC, datetime
from enum import StrEnum

from pydantic import BaseModel, Field


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


class Verdict(BaseModel):
    evaluation_id: str
    task_index: int
    attempt: int
    paper_category: str
    status: VerdictStatus
    checks: list[CheckResult] = Field(default_factory=list)
    reason: str = ""
    turns: int = 0
    sandbox_id: str | None = None
    graded_at: datetime = Field(default_factory=lambda: datetime.now(UTC))


class CategoryMetrics(BaseModel):
    tasks: int
    passed: int
    pass_rate: float


class Metrics(BaseModel):
    """PyBench's figures for one evaluation."""

    tasks: int
    passed: int
    pass_rate: float
    """Passed over all tasks of the evaluation (unavailable and infra-failed tasks count as not passed)."""
    per_category: dict[str, CategoryMetrics]
    avg_turns: float
    """Mean number of assistant turns over the tasks that ran."""
    by_status: dict[VerdictStatus, int]


class Results(BaseModel):
    """The answer of ``GET /v1/evaluations/{id}/results``."""

    evaluation_id: str
    complete: bool
    verdicts: list[Verdict]
    metrics: Metrics
