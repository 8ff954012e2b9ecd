"""Paired comparison of two evaluations: does B beat A on the same tasks, by how much, and how sure is that?

``GET /v1/compare?a=<id>&b=<id>``: for each grading (original, fixed, and the judge's where both were judged), the
mean per-task difference B minus A with its standard error and 95% interval, and a p-value from a paired test
(exact McNemar for one epoch each, a sign-flip permutation test otherwise), overall and per category
(``services.results.comparison``, ``services.results.estimates``; docs/protocol.md states them). Only runs with the same
``comparable_key`` are compared (the same suite content, tasks, prompt, mode and turn limit, and verdicts graded with
the same checks), and only once both have completed.
"""

from typing import Annotated, Any

from fastapi import APIRouter, Query

from gateway import readmodel
from gateway.auth import Caller
from gateway.deps import StateDep
from gateway.problems import Problem
from gateway.routers.evaluations import owned
from services.evaluation import Evaluation, EvaluationStatus
from services.results.comparison import paired
from services.state import EVALUATION_ID

router = APIRouter(prefix="/v1/compare", tags=["compare"])

_ID = Query(min_length=1, max_length=64, pattern=f"^{EVALUATION_ID.pattern}$")


def _comparable_key(evaluation: Evaluation) -> str | None:
    return evaluation.manifest.comparable_key if evaluation.manifest is not None else None


@router.get("", operation_id="compare_evaluations")
def compare_evaluations(
    caller: Caller, state: StateDep, a: Annotated[str, _ID], b: Annotated[str, _ID]
) -> dict[str, Any]:
    """The paired comparison of evaluation ``b`` against ``a`` (differences are B minus A).

    Raises:
        Problem: 404 when either is not one the key may see; 409 when they are the same, not both completed,
            or not comparable (different comparable keys: the detail says which).
    """
    if a == b:
        raise Problem(409, "Same evaluation", "compare two different evaluations: a and b are the same")
    first, second = owned(state, caller, a), owned(state, caller, b)
    unfinished = [e.id for e in (first, second) if readmodel.status(state, e.id) is not EvaluationStatus.COMPLETED]
    if unfinished:
        raise Problem(
            409, "Not completed", f"compare completed evaluations; {', '.join(unfinished)} has not completed yet"
        )
    keys = (_comparable_key(first), _comparable_key(second))
    if keys[0] is None or keys[0] != keys[1]:
        raise Problem(
            409,
            "Not comparable",
            f"{a} and {b} did not run the same suite content, tasks, prompt, mode and turn limit, or were graded "
            f"with different checks (comparable keys {keys[0]} and {keys[1]}); compare runs of one leaderboard group",
        )
    return {
        "a": a,
        "b": b,
        "comparable_key": keys[0],
        "models": {"a": first.model.model, "b": second.model.model},
        "difference": "b - a",
        "gradings": paired([state.verdicts(a)], [state.verdicts(b)]),
    }
