"""Grading a finished evaluation again: ``POST /v1/evaluations/{id}/regrade``.

Every task whose session tested the agent is graded again from its stored trajectory and files, with the checks
the grader has now and, when ``judge`` is given, a new LLM judge: no session starts and no model is called (but
the judge). The evaluation's ``grading`` goes up by one; each new verdict records it, with the grader build and the
checks hash it was graded with, and the store keeps the verdict each replaced as ``verdict-grading-<n>.json``
beside it. The manifest lists the grading (``manifest.gradings``), filled in when it completes; its comparable key
changes only when the new verdicts were graded with other checks (``services.results.manifest``).
"""

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field, SecretStr

from gateway import readmodel
from gateway.auth import Caller
from gateway.deps import LifecycleDep, SettingsDep, StateDep, StoreDep
from gateway.egress import check_url_field
from gateway.problems import Problem
from gateway.routers.evaluations import owned
from services.evaluation import EvaluationStatus, EvaluationView, JudgeConfig

router = APIRouter(prefix="/v1/evaluations", tags=["evaluations"])


class RegradeRequest(BaseModel):
    model_config = {"extra": "forbid"}

    judge: JudgeConfig | None = Field(
        default=None, description="A judge for this grading (the evaluation's own, if any, when omitted)."
    )
    judge_api_key: SecretStr | None = Field(default=None, description="That judge endpoint's key, if it needs one.")


@router.post(
    "/{evaluation_id}/regrade",
    operation_id="regrade_evaluation",
    summary="Grade a finished evaluation again from its stored sessions (no session starts, no model is called)",
)
def regrade(
    evaluation_id: str,
    caller: Caller,
    state: StateDep,
    lifecycle: LifecycleDep,
    store: StoreDep,
    settings: SettingsDep,
    request: Request,
    body: RegradeRequest | None = None,
) -> EvaluationView:
    """Raises:
    Problem: 409 when the evaluation has not finished; 403 or 422 for a judge endpoint the egress policy refuses
        or that does not resolve; 404 when the key may not see it."""
    body = body or RegradeRequest()
    evaluation = owned(state, caller, evaluation_id)
    if readmodel.status(state, evaluation.id) is not EvaluationStatus.COMPLETED:
        raise Problem(409, "Not finished", "regrade a completed evaluation; this one is still running or cancelled")
    if body.judge is not None:
        check_url_field(
            "judge.endpoint.base_url", body.judge.endpoint.base_url, settings, request.app.state.egress_resolver
        )
    judge_key = body.judge_api_key.get_secret_value() if body.judge_api_key else None
    lifecycle.regrade(evaluation, body.judge, judge_key)
    regraded = state.get(evaluation.id)
    store.put_evaluation(regraded)
    return readmodel.view(state, regraded)
