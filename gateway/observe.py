"""The gateway's Prometheus endpoint: ``GET /metrics`` with the request series of this app and the fleet's state
read from Redis (``services.observability.monitoring``): counts by route, status and state, never an id, a model or a
key.
``PBE_METRICS_ACCESS`` says who may read it: anyone (``open``), an admin key (``admin``), nobody (``off``)."""

import time
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest
from redis import Redis

from services.live.apikeys import ApiKeyStore
from services.observability.monitoring import LATENCY_BUCKETS, gateway_registry

UNMATCHED_ROUTE = "unmatched"
"""The route label of requests no route matched (404s of made-up paths), so that they cannot grow the labels."""

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
"""The method labels; any other method a client sends (HTTP allows any token) is counted as ``OTHER_METHOD``."""
OTHER_METHOD = "other"


def install_metrics(app: FastAPI, redis: Redis, access: str = "open", admin_key: str | None = None) -> None:
    """Count every request of ``app`` by method, route template and status, and serve ``GET /metrics`` to whom
    ``access`` allows (``open``, ``admin``: a bearer admin key, checked against ``admin_key`` and the stored keys;
    ``off``: 404)."""
    registry = gateway_registry(redis)
    requests = Counter(
        "pbe_http_requests", "Requests by method, route and status", ["method", "route", "status"], registry=registry
    )
    latency = Histogram(
        "pbe_http_request_duration_seconds",
        "Time to the response's start, by method and route",
        ["method", "route"],
        buckets=LATENCY_BUCKETS,
        registry=registry,
    )

    @app.middleware("http")
    async def _count(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        started = time.perf_counter()
        status = 500
        try:
            response = await call_next(request)
            status = response.status_code
            return response
        finally:
            route = getattr(request.scope.get("route"), "path", UNMATCHED_ROUTE)
            method = request.method if request.method in METHODS else OTHER_METHOD
            requests.labels(method=method, route=route, status=str(status)).inc()
            latency.labels(method=method, route=route).observe(time.perf_counter() - started)

    keys = ApiKeyStore(redis, admin_key)

    @app.get("/metrics", include_in_schema=False)
    def metrics(request: Request) -> Response:
        if access == "off":
            return Response("metrics are off here (PBE_METRICS_ACCESS=off)\n", status_code=404, media_type="text/plain")
        if access == "admin":
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            key = keys.authenticate(token.strip()) if scheme.lower() == "bearer" else None
            if key is None or not key.admin:
                return Response(
                    "metrics need an admin API key here (PBE_METRICS_ACCESS=admin): send Authorization: Bearer\n",
                    status_code=401,
                    media_type="text/plain",
                    headers={"WWW-Authenticate": "Bearer"},
                )
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
