"""The FastAPI app: ``uvicorn --factory gateway.app:create_app``.

Settings are read and checked when the app is made; Redis is connected lazily per request.
"""

from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from redis import Redis
from redis.exceptions import RedisError

from gateway.problems import install_problem_handlers, problem_response
from gateway.routers import evaluations, suites
from gateway.settings import GatewaySettings


def create_app(settings: GatewaySettings | None = None) -> FastAPI:
    """Make the gateway app.

    Raises:
        ConfigurationError: no suite at ``PBE_SUITE_PATH``.
    """
    settings = settings or GatewaySettings()
    settings.require_suite()
    app = FastAPI(
        title="pybench-eval",
        version="0.1.0",
        description="Evaluate LLM agents that solve real-world tasks in a sandboxed Python interpreter.",
    )
    app.state.settings = settings
    app.state.redis = Redis.from_url(settings.REDIS_URL)
    install_problem_handlers(app)
    app.include_router(evaluations.router)
    app.include_router(suites.router)

    @app.middleware("http")
    async def _limit_body(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > settings.MAX_BODY_BYTES:
            return problem_response(
                413,
                "Request too large",
                f"the body may be at most {settings.MAX_BODY_BYTES} bytes",
                request.url.path,
            )
        try:
            return await call_next(request)
        except RedisError as exc:
            return problem_response(
                503,
                "Redis unavailable",
                f"the service cannot reach Redis ({type(exc).__name__}); retry shortly",
                request.url.path,
            )

    @app.get("/health", operation_id="health", tags=["health"])
    def health() -> dict[str, str]:
        app.state.redis.ping()
        return {"status": "ok"}

    return app
