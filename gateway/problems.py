"""Errors as ``application/problem+json`` (RFC 9457), each with a ``detail`` that says what to do next."""

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.errors import (
    ArtifactExpiredError,
    ArtifactNotFoundError,
    ConfigurationError,
    PybenchEvalError,
    TaskNotFoundError,
)
from services.state import EvaluationNotFoundError

PROBLEM_JSON = "application/problem+json"

logger = logging.getLogger(__name__)


class Problem(Exception):
    """An error the API reports as a problem document."""

    def __init__(
        self, status: int, title: str, detail: str, *, headers: dict[str, str] | None = None, **extra: Any
    ) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail, self.extra = status, title, detail, extra
        self.headers = headers or {}


def problem_response(
    status: int, title: str, detail: str, instance: str, *, headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail, "instance": instance, **extra}
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


_STATUS_OF: list[tuple[type[PybenchEvalError], int, str]] = [
    (EvaluationNotFoundError, 404, "Evaluation not found"),
    (TaskNotFoundError, 404, "Task not found"),
    (ArtifactExpiredError, 410, "Artifact expired"),  # before its base class, ArtifactNotFoundError
    (ArtifactNotFoundError, 404, "Not found"),
    (ConfigurationError, 503, "Service misconfigured"),
]


def install_problem_handlers(app: FastAPI) -> None:
    """Report every error of the API, and every unexpected one, as a problem document."""

    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem) -> JSONResponse:
        return problem_response(exc.status, exc.title, exc.detail, request.url.path, headers=exc.headers, **exc.extra)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
            for e in exc.errors()
        ]
        where = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors[:5])
        detail = f"the request is not valid ({where}); see the schema at /docs"
        return problem_response(422, "Invalid request", detail, request.url.path, errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = str(exc.detail) if exc.status_code != 404 else f"no such resource {request.url.path}; see /docs"
        return problem_response(exc.status_code, "HTTP error", detail, request.url.path)

    @app.exception_handler(PybenchEvalError)
    async def _service(request: Request, exc: PybenchEvalError) -> JSONResponse:
        for error_type, status, title in _STATUS_OF:
            if isinstance(exc, error_type):
                return problem_response(status, title, str(exc), request.url.path)
        logger.error("%s %s: %s", request.method, request.url.path, exc)  # the whole message, paths included
        return problem_response(
            500, "Internal error", f"{type(exc).__name__}: the service could not do this; see its log", request.url.path
        )
