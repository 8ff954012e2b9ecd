"""The leaderboard: per model, its best and its latest completed evaluation (of those the caller may see)."""

from datetime import datetime

from fastapi import APIRouter
from pydantic import BaseModel

from gateway.auth import Caller
from gateway.deps import StateDep
from services.evaluation import EvaluationStatus
from services.metrics import compute_metrics

router = APIRouter(prefix="/v1/leaderboard", tags=["leaderboard"])

MAX_EVALUATIONS = 2000
"""How many of the newest evaluations the leaderboard reads."""


class Standing(BaseModel):
    evaluation_id: str
    created_at: datetime
    pass_rate: float
    """Pass Rate UT of the original grading, over every task of the evaluation (comparable with the paper)."""
    fixed_pass_rate: float | None = None
    llm_pass_rate: float | None = None
    tasks: int
    avg_turns: float


class LeaderboardRow(BaseModel):
    model: str
    evaluations: int
    best: Standing
    latest: Standing


@router.get("", operation_id="get_leaderboard", summary="Per model: best and latest completed evaluation")
def get_leaderboard(caller: Caller, state: StateDep) -> list[LeaderboardRow]:
    rows: dict[str, list[Standing]] = {}
    owner = None if caller.admin else caller.id
    for evaluation_id, _ in state.evaluation_ids(owner, limit=MAX_EVALUATIONS):
        progress = state.progress(evaluation_id)
        if state.status(progress, evaluation_id) is not EvaluationStatus.COMPLETED:
            continue
        evaluation = state.get(evaluation_id)
        metrics = compute_metrics(state.verdicts(evaluation_id))
        rows.setdefault(evaluation.model.model, []).append(
            Standing(
                evaluation_id=evaluation_id,
                created_at=evaluation.created_at,
                pass_rate=metrics.pass_rate,
                fixed_pass_rate=metrics.fixed.pass_rate if metrics.fixed else None,
                llm_pass_rate=metrics.llm.pass_rate if metrics.llm else None,
                tasks=metrics.tasks,
                avg_turns=metrics.avg_turns,
            )
        )
    board = [
        LeaderboardRow(
            model=model,
            evaluations=len(standings),
            best=max(standings, key=lambda s: (s.pass_rate, s.created_at)),
            latest=max(standings, key=lambda s: s.created_at),
        )
        for model, standings in rows.items()
    ]
    return sorted(board, key=lambda row: row.best.pass_rate, reverse=True)
