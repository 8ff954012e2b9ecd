"""The leaderboard: completed evaluations ranked only against comparable ones.

Two runs are comparable when their manifests share a ``comparable_key``: the same suite content, the same tasks,
system prompt, mode and turn limit, and current verdicts graded with the same checks (``services.results.manifest``; a
regrade with other checks moves a run to another group once it completes). Each group is ranked on its own, per
model its best and latest run, with per-category pass rates, tokens and cost; groups come in order of their task
count, largest first, so a three-task run never outranks a full one. Evaluations stored before manifests were
recorded form a group per suite and task count of their own.
"""

from datetime import datetime

from fastapi import APIRouter
from pydantic import BaseModel

from gateway import readmodel
from gateway.auth import Caller
from gateway.deps import StateDep
from services.evaluation import Evaluation, EvaluationStatus
from services.results.comparison import Outcomes, outcomes
from services.results.estimates import compare, estimate
from services.results.scores import compute_metrics

router = APIRouter(prefix="/v1/leaderboard", tags=["leaderboard"])

MAX_EVALUATIONS = 2000
"""How many of the newest evaluations the leaderboard reads."""

SEPARABLE_P = 0.05
"""A row is separable from its group's leader when the paired test's p-value is below this."""


class Standing(BaseModel):
    evaluation_id: str
    created_at: datetime
    pass_rate: float
    """Pass Rate UT of the original grading, over every task of the evaluation (comparable with the paper)."""
    fixed_pass_rate: float | None = None
    llm_pass_rate: float | None = None
    tasks: int
    avg_turns: float
    per_category: dict[str, float] = {}
    """The original grading's pass rate per PyBench category."""
    ci_low: float | None = None
    ci_high: float | None = None
    """The 95% interval of the original grading's pass rate over the tasks it decided
    (``services.results.estimates``)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None


class LeaderboardRow(BaseModel):
    comparable_key: str
    """The group this row is ranked in (``RunManifest.comparable_key``)."""
    suite: str
    task_count: int
    prompt: str
    mode: str
    rank: int
    """1 for the best model of its group."""
    model: str
    evaluations: int
    best: Standing
    latest: Standing
    p_value_vs_leader: float | None = None
    """The paired test's p-value of this model's best run against the leader's, on the original grading (None for
    the leader); see ``GET /v1/compare``."""
    separable_from_leader: bool | None = None
    """Whether that p-value is below ``SEPARABLE_P`` (None for the leader): False means the two are not told apart
    by this suite, whatever their order."""


def _group(evaluation: Evaluation) -> str:
    if evaluation.manifest is not None:
        return evaluation.manifest.comparable_key
    return f"unrecorded:{evaluation.suite}:{len(evaluation.tasks)}:{evaluation.prompt}:{evaluation.mode}"


@router.get(
    "",
    operation_id="get_leaderboard",
    summary="Per group of comparable runs, per model: best and latest completed evaluation",
)
def get_leaderboard(caller: Caller, state: StateDep) -> list[LeaderboardRow]:
    groups: dict[str, dict[str, list[tuple[Evaluation, Standing]]]] = {}
    outcomes_of: dict[str, Outcomes] = {}
    owner = None if caller.admin else caller.id
    for evaluation_id, _ in state.evaluation_ids(owner, limit=MAX_EVALUATIONS):
        if readmodel.status(state, evaluation_id) is not EvaluationStatus.COMPLETED:
            continue
        evaluation = state.get(evaluation_id)
        verdicts = state.verdicts(evaluation_id)
        metrics = compute_metrics(verdicts, evaluation.prices)
        outcomes_of[evaluation_id] = outcomes([verdicts], "original")
        interval = estimate(outcomes_of[evaluation_id])
        standing = Standing(
            evaluation_id=evaluation_id,
            created_at=evaluation.created_at,
            pass_rate=metrics.pass_rate,
            fixed_pass_rate=metrics.fixed.pass_rate if metrics.fixed else None,
            llm_pass_rate=metrics.llm.pass_rate if metrics.llm else None,
            tasks=metrics.tasks,
            avg_turns=metrics.avg_turns,
            per_category={name: c.pass_rate for name, c in metrics.per_category.items()},
            prompt_tokens=metrics.prompt_tokens,
            completion_tokens=metrics.completion_tokens,
            cost_usd=metrics.cost_usd,
            ci_low=interval.ci_low,
            ci_high=interval.ci_high,
        )
        groups.setdefault(_group(evaluation), {}).setdefault(evaluation.model.model, []).append((evaluation, standing))
    board: list[LeaderboardRow] = []
    for key, models in groups.items():
        rows = []
        for model, runs in models.items():
            best = max(runs, key=lambda r: (r[1].pass_rate, r[1].created_at))
            latest = max(runs, key=lambda r: r[1].created_at)
            evaluation = best[0]
            rows.append(
                LeaderboardRow(
                    comparable_key=key,
                    suite=evaluation.suite,
                    task_count=len(evaluation.tasks),
                    prompt=evaluation.prompt,
                    mode=evaluation.mode,
                    rank=0,
                    model=model,
                    evaluations=len(runs),
                    best=best[1],
                    latest=latest[1],
                )
            )
        rows.sort(key=lambda row: row.best.pass_rate, reverse=True)
        for rank, row in enumerate(rows, start=1):
            row.rank = rank
        leader = outcomes_of[rows[0].best.evaluation_id]
        for row in rows[1:]:
            paired = compare(leader, outcomes_of[row.best.evaluation_id])
            row.p_value_vs_leader = paired.p_value
            row.separable_from_leader = None if paired.p_value is None else paired.p_value < SEPARABLE_P
        board += rows
    board.sort(key=lambda row: (-row.task_count, row.comparable_key, row.rank))
    return board
