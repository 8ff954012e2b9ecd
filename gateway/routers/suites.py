"""Suites: what can be evaluated, and which tasks cannot run in this copy."""

from fastapi import APIRouter
from pydantic import BaseModel

from gateway.auth import Caller
from gateway.deps import SuiteDep
from gateway.problems import Problem
from services.task import TaskSummary

router = APIRouter(prefix="/v1/suites", tags=["suites"])


class SuiteSummary(BaseModel):
    name: str
    tasks: int
    unavailable_tasks: list[int]
    prompts: list[str]


@router.get("", operation_id="list_suites", summary="The suites this service offers")
def list_suites(caller: Caller, suite: SuiteDep) -> list[SuiteSummary]:
    return [
        SuiteSummary(
            name=suite.name,
            tasks=len(suite.tasks),
            unavailable_tasks=sorted(t.index for t in suite.tasks.values() if not t.available),
            prompts=suite.prompts(),
        )
    ]


@router.get("/{name}/tasks", operation_id="list_suite_tasks", summary="A suite's tasks and their availability")
def list_suite_tasks(name: str, caller: Caller, suite: SuiteDep) -> list[TaskSummary]:
    if name != suite.name:
        raise Problem(404, "Suite not found", f"no suite {name!r}; this service offers {suite.name!r}")
    return suite.summaries()
