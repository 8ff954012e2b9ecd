"""The epochs of a run: ``GET /v1/evaluations/{id}/epochs`` (any epoch's id) lists them, with each epoch's seed
and status, and the run's statistics over every epoch's verdicts: per grading and category the mean over epochs,
its standard error clustered by task, a 95% interval, pass@k for k = 1..epochs and pass^k
(``services.results.estimates``).
Statistics over unfinished epochs cover the tasks graded so far (``complete`` says whether every epoch finished).
"""

from typing import Any

from fastapi import APIRouter

from gateway import readmodel
from gateway.auth import Caller
from gateway.deps import StateDep
from gateway.routers.evaluations import owned
from services.evaluation import EvaluationStatus
from services.results.comparison import estimates

router = APIRouter(prefix="/v1/evaluations", tags=["evaluations"])


@router.get("/{evaluation_id}/epochs", operation_id="get_epochs")
def get_epochs(evaluation_id: str, caller: Caller, state: StateDep) -> dict[str, Any]:
    """The run that ``evaluation_id`` is an epoch of: its epochs and their statistics.

    Raises:
        EvaluationNotFoundError: no evaluation the key may see has that id (404).
    """
    evaluation = owned(state, caller, evaluation_id)
    members = [state.get(member) for member in state.run_members(evaluation)]
    statuses = [readmodel.status(state, member.id) for member in members]
    return {
        "run_id": evaluation.run_id or evaluation.id,
        "epochs": [
            {"epoch": member.epoch, "evaluation_id": member.id, "seed": member.sampling.seed, "status": status}
            for member, status in zip(members, statuses, strict=True)
        ],
        "complete": all(status is EvaluationStatus.COMPLETED for status in statuses),
        "statistics": estimates([state.verdicts(member.id) for member in members]),
    }
