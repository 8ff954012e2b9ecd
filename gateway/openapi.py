"""The OpenAPI document as served: errors documented as problem documents, and the suite's own vocabulary
(its name, prompts and task indices) written into the submission's schema, so that what the schema calls
valid is what the service accepts."""

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from services.pybench.suite import Suite

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "An RFC 9457 problem document; `detail` says what to do next.",
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "instance": {"type": "string"},
    },
    "required": ["title", "status", "detail"],
}

_ALWAYS = {"401": "No valid API key", "429": "Past the key's request rate (see Retry-After)"}
_WITH_PATH_PARAMETERS = {"404": "No such resource (or another key's)"}
_WITH_INPUT = {"422": "The request does not fit the schema"}
_WITH_BODY = {"413": "The body is too large"}
_SUBMISSION = {
    "403": "An endpoint the egress policy refuses (internal address); the operator may allow it",
    "409": "Idempotency-Key reused with another body, its first submission still in progress, or the key's "
    "stored artifacts at its storage quota",
    "503": "The queue is full (see Retry-After), or the service keeps no API keys (PBE_SECRETS_KEY unset)",
}
_EXPIRABLE = {"410": "Retention removed it (the detail says when, and by which setting); results and verdicts stay"}
_BY_OPERATION = {
    "create_evaluation": _SUBMISSION,
    "retry_evaluation_tasks": {"409": "The evaluation is cancelled, or a task named has no failed verdict"},
    "compare_evaluations": {
        "404": "Either evaluation is not one the key may see",
        "409": "The same evaluation twice, one not completed, or runs that are not comparable",
    },
    "regrade_evaluation": {
        "403": "A judge endpoint the egress policy refuses",
        "409": "The evaluation has not finished",
        "503": "A judge key given, and the service keeps no API keys (PBE_SECRETS_KEY unset)",
    },
    "get_trajectory": _EXPIRABLE,
    "list_task_files": _EXPIRABLE,
    "download_task_file": _EXPIRABLE,
    "download_archive": _EXPIRABLE,
}
"""The problems particular to an operation, by its operationId."""


def _problem(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}},
    }


def install(app: FastAPI, suite: Suite) -> None:
    """Serve ``app``'s OpenAPI document with its errors and the suite's vocabulary written in."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        schema.setdefault("components", {}).setdefault("schemas", {})["Problem"] = PROBLEM_SCHEMA
        for path, operations in schema["paths"].items():
            for operation in operations.values():
                responses = operation.setdefault("responses", {})
                codes: dict[str, str] = {}
                if path.startswith("/v1/"):
                    codes |= _ALWAYS
                if "{" in path:
                    codes |= _WITH_PATH_PARAMETERS
                if operation.get("parameters") or operation.get("requestBody"):
                    codes |= _WITH_INPUT
                if operation.get("requestBody"):
                    codes |= _WITH_BODY
                codes |= _BY_OPERATION.get(operation.get("operationId", ""), {})
                for code, description in codes.items():
                    responses[code] = _problem(description)
        _suite_vocabulary(schema["components"]["schemas"], suite)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _suite_vocabulary(schemas: dict[str, Any], suite: Suite) -> None:
    create = schemas["EvaluationCreate"]["properties"]
    create["suite"] = {**create["suite"], "enum": [suite.name]}
    create["prompt"] = {**create["prompt"], "enum": suite.prompts()}
    for option in create["tasks"]["anyOf"]:
        if option.get("type") == "array":
            option.update(minItems=1, uniqueItems=True, items={"type": "integer", "enum": sorted(suite.tasks)})
