"""The FastAPI app: ``uvicorn --factory gateway.app:create_app``.

Settings are read and checked when the app is made; Redis is connected lazily per request.
"""

import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from redis import Redis
from redis.exceptions import RedisError

from gateway import openapi, reconcile
from gateway.bodylimit import BodySizeLimit
from gateway.dashboard.pages import install_dashboard
from gateway.observe import install_metrics
from gateway.problems import install_problem_handlers, problem_response
from gateway.routers import compare, epochs, evaluations, leaderboard, regrade, suites
from gateway.settings import GatewaySettings
from gateway.streams import OpenStreams
from services.endpoint.netguard import Resolver, resolve_host
from services.live.retention import RetentionPolicy
from services.observability.logs import LOG_FORMAT_VARIABLE, configure_logging
from services.pybench.suite import load_suite
from services.store import ArtifactStore


def create_app(settings: GatewaySettings | None = None, *, resolver: Resolver = resolve_host) -> FastAPI:
    """Make the gateway app. ``resolver`` resolves submitted endpoints' hosts for the egress check.

    Raises:
        ConfigurationError: no suite at ``PBE_SUITE_PATH``.
    """
    settings = settings or GatewaySettings()
    suite = load_suite(settings.require_suite(), settings.SUITE_NAME)
    redis = Redis.from_url(settings.REDIS_URL)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        stop = threading.Event()
        if settings.RECONCILE_INTERVAL_S > 0:
            store = ArtifactStore(settings.ARTIFACT_ROOT)
            app.state.reconciler = reconcile.run_periodically(
                redis, store, suite, settings.RECONCILE_INTERVAL_S, stop, RetentionPolicy(days=settings.RETENTION_DAYS)
            )
        yield
        stop.set()

    app = FastAPI(
        title="pybench-eval",
        version="0.1.0",
        description="Evaluate LLM agents that solve real-world tasks in a sandboxed Python interpreter. "
        "Every /v1 route needs `Authorization: Bearer <API key>`; errors are `application/problem+json`.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.redis = redis
    app.state.egress_resolver = resolver
    app.state.reconciler = None
    app.state.streams = OpenStreams(settings.MAX_STREAMS_PER_KEY, settings.MAX_STREAMS)
    openapi.install(app, suite)
    install_problem_handlers(app)
    app.include_router(evaluations.router)
    app.include_router(suites.router)
    app.include_router(leaderboard.router)
    app.include_router(compare.router)
    app.include_router(epochs.router)
    app.include_router(regrade.router)
    if os.environ.get(LOG_FORMAT_VARIABLE, "").strip().lower() == "json":
        configure_logging("json")

    # The body limit (declared or streamed). Innermost, added first: an HTTPException raised from ``receive``
    # then reaches the route's body reading as is.
    app.add_middleware(BodySizeLimit, max_bytes=settings.MAX_BODY_BYTES)

    @app.middleware("http")
    async def _guard(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if "\x00" in request.url.path or "%00" in request.url.path:
            return problem_response(
                400, "Bad path", "the path holds a NUL byte; no name here has one", request.url.path.replace("\x00", "")
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

    install_dashboard(app)
    admin_key = settings.ADMIN_KEY.get_secret_value() if settings.ADMIN_KEY else None
    # outermost: it sees every answer, the guard's and the body limit's too
    install_metrics(app, redis, settings.METRICS_ACCESS, admin_key)

    @app.get("/health", operation_id="health", tags=["health"])
    def health(response: Response) -> dict[str, str]:
        """``ok`` when Redis answers and the reconciler (when on) is alive; 503 ``degraded`` saying which not."""
        app.state.redis.ping()
        thread = app.state.reconciler
        if thread is not None and not thread.is_alive():
            response.status_code = 503
            return {"status": "degraded", "reconciler": "dead: restart the gateway"}
        return {"status": "ok"}

    return app
