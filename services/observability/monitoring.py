"""Prometheus series of the service, for operators (``GET /metrics`` on the gateway, ``PBE_METRICS_PORT`` on each
worker). Labels are bounded sets (routes as templates, states, causes): never an id, a model name or a key.

Gateway (a registry per app, see ``gateway.observe``): ``pbe_http_requests_total{method,route,status}``,
``pbe_http_request_duration_seconds{method,route}``, and read from Redis at each scrape ``pbe_evaluations{state}``,
``pbe_tasks{state}``, ``pbe_queue_depth{queue}``, ``pbe_sessions_in_flight`` (all executors).

Executor (the process's default registry): ``pbe_executor_sessions_in_flight``, ``pbe_sessions_total{end_reason}``,
``pbe_infra_errors_total{cause}``, ``pbe_session_retries_total``, ``pbe_sandbox_start_seconds{warm}``,
``pbe_cell_duration_seconds{outcome}``, ``pbe_model_latency_seconds``, ``pbe_tokens_total{kind}``.

Grader: ``pbe_gradings_total{status}``, ``pbe_grading_seconds``.
"""

import ipaddress
import logging
import socket
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from redis import Redis, RedisError
from rq import Queue
from rq.registry import StartedJobRegistry

from services.errors import ConfigurationError
from services.evaluation import EvaluationStatus, TaskState
from services.queues import GRADING_QUEUE, SESSIONS_QUEUE
from services.state import StateStore
from services.trajectory import Trajectory

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
"""Seconds: model calls, cells, sandbox starts and gradings all fall in here."""

MAX_SCRAPED_EVALUATIONS = 1000
"""How many of the newest evaluations a gateway scrape counts by state (older ones are finished in practice)."""

SESSIONS_IN_FLIGHT = Gauge("pbe_executor_sessions_in_flight", "Sessions this executor runs now")
SESSIONS = Counter("pbe_sessions", "Task sessions ended, by end reason", ["end_reason"])
INFRA_ERRORS = Counter("pbe_infra_errors", "Sessions that did not get to test the agent, by cause", ["cause"])
RETRIES = Counter("pbe_session_retries", "Sessions run again as a later attempt (an earlier one hit infra)")
SANDBOX_START = Histogram(
    "pbe_sandbox_start_seconds", "From a session's start until its kernel answered", ["warm"], buckets=LATENCY_BUCKETS
)
CELL_DURATION = Histogram(
    "pbe_cell_duration_seconds", "Wall time of code cells, by outcome", ["outcome"], buckets=LATENCY_BUCKETS
)
MODEL_LATENCY = Histogram("pbe_model_latency_seconds", "Wall time of chat completions", buckets=LATENCY_BUCKETS)
TOKENS = Counter("pbe_tokens", "Tokens the endpoints reported, by kind", ["kind"])
GRADINGS = Counter("pbe_gradings", "Gradings done, by the original grading's status", ["status"])
GRADING_TIME = Histogram("pbe_grading_seconds", "Wall time of one grading (checks and judge)", buckets=LATENCY_BUCKETS)


def record_session(trajectory: Trajectory) -> None:
    """Count an ended session: its end reason, sandbox start, cells, model calls and tokens. Never raises."""
    try:
        reason = trajectory.end_reason
        SESSIONS.labels(end_reason=reason.value).inc()
        if reason.infra:
            INFRA_ERRORS.labels(cause=reason.value).inc()
        if trajectory.attempt > 1:
            RETRIES.inc()
        if trajectory.session is not None:
            SANDBOX_START.labels(warm=str(trajectory.session.warm).lower()).observe(trajectory.session.ready_s)
        for turn in trajectory.turns:
            MODEL_LATENCY.observe(turn.model_latency_s)
            if turn.prompt_tokens:
                TOKENS.labels(kind="prompt").inc(turn.prompt_tokens)
            if turn.completion_tokens:
                TOKENS.labels(kind="completion").inc(turn.completion_tokens)
            if turn.execution is not None:
                execution = turn.execution
                outcome = "timeout" if execution.timed_out else "error" if execution.error_name else "ok"
                CELL_DURATION.labels(outcome=outcome).observe(execution.duration_s)
    except Exception:  # counting must never cost a session
        log.exception("could not count a session in the metrics")


def record_grading(seconds: float, status: str) -> None:
    """Count one grading that took ``seconds`` (``status``: the verdict's, or ``error`` for a grading that failed)."""
    GRADINGS.labels(status=status).inc()
    GRADING_TIME.observe(seconds)


ROUTE_TO_REDIS = "route-to:redis"
"""``PBE_METRICS_HOST``'s value that serves on the address a worker reaches Redis from (``metrics_address``)."""


def metrics_address(host: str, redis_url: str) -> str:
    """The address a worker's metrics listen on for ``PBE_METRICS_HOST`` = ``host``: an IP address as it is, or,
    for ``route-to:redis``, this host's address on the route to Redis (``redis_url``'s host): the services'
    network, never the sandboxes' (an executor shares a network with its sandboxes, which must find nothing
    listening there). Finding the route sends nothing (a UDP socket is connected, not written to).

    Raises:
        ConfigurationError: ``host`` is neither an IP address nor ``route-to:redis``, or Redis's host does not
            resolve.
    """
    if host != ROUTE_TO_REDIS:
        try:
            return str(ipaddress.ip_address(host))
        except ValueError:
            raise ConfigurationError(
                f"PBE_METRICS_HOST must be an IP address or {ROUTE_TO_REDIS!r}, not {host!r}"
            ) from None
    parts = urllib.parse.urlsplit(redis_url)
    try:
        family, _, _, _, address = socket.getaddrinfo(
            parts.hostname or "127.0.0.1", parts.port or 6379, 0, socket.SOCK_DGRAM
        )[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(address)
            return str(probe.getsockname()[0])
    except OSError as exc:
        raise ConfigurationError(
            f"cannot find the route to Redis at {parts.hostname!r} for the metrics' address ({exc}); "
            "set PBE_METRICS_HOST to an IP address"
        ) from exc


def serve_worker_metrics(port: int, host: str = "127.0.0.1") -> bool:
    """Serve the process's series on ``http://host:port/metrics`` from a background thread; port 0 serves nothing.
    Returns whether it serves. Never raises: a port in use is logged and the worker goes on without."""
    if not port:
        return False
    try:
        start_http_server(port, addr=host, registry=REGISTRY)
    except OSError as exc:
        log.warning("metrics not served on %s:%d (%s); set PBE_METRICS_PORT to a free port or 0", host, port, exc)
        return False
    log.info("metrics on http://%s:%d/metrics", host, port)
    return True


class RedisStateCollector(Collector):
    """At each scrape, the fleet's state as Redis holds it: evaluations and tasks by state, queue depths, and the
    sessions all executors run. A Redis that does not answer yields no series (and a log line), never an error."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            families = self._families()
        except RedisError as exc:
            log.warning("metrics: Redis did not answer (%s)", exc)
            return
        yield from families

    def _families(self) -> list[GaugeMetricFamily]:
        state = StateStore(self._redis)
        evaluations = {s.value: 0 for s in EvaluationStatus}
        tasks = {s.value: 0 for s in TaskState}
        for evaluation_id, _ in state.evaluation_ids(None, limit=MAX_SCRAPED_EVALUATIONS):
            progress = state.progress(evaluation_id)
            evaluations[state.status(progress, evaluation_id).value] += 1
            for task_state, count in progress.counts.items():
                tasks[TaskState(task_state).value] += count
        by_evaluation = GaugeMetricFamily(
            "pbe_evaluations", "Evaluations by status (the newest 1000)", labels=["state"]
        )
        by_task = GaugeMetricFamily("pbe_tasks", "Tasks of those evaluations by state", labels=["state"])
        for name, count in evaluations.items():
            by_evaluation.add_metric([name], count)
        for name, count in tasks.items():
            by_task.add_metric([name], count)
        depth = GaugeMetricFamily("pbe_queue_depth", "Jobs waiting in each queue", labels=["queue"])
        for queue in (SESSIONS_QUEUE, GRADING_QUEUE):
            depth.add_metric([queue], len(Queue(queue, connection=self._redis)))
        running = GaugeMetricFamily("pbe_sessions_in_flight", "Sessions all executors run now")
        running.add_metric([], len(StartedJobRegistry(SESSIONS_QUEUE, connection=self._redis)))
        return [by_evaluation, by_task, depth, running]


def gateway_registry(redis: Redis) -> CollectorRegistry:
    """A registry for one gateway app: its Redis collector (the app adds its request series)."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(RedisStateCollector(redis))
    return registry


def main() -> int:
    """``python3 -m services.observability.monitoring``: print this worker's series, read where it serves them (its
    ``PBE_METRICS_HOST`` and ``PBE_METRICS_PORT``), as an operator inside its container would."""
    from services.settings import ServiceSettings

    settings = ServiceSettings()
    if not settings.METRICS_PORT:
        print("PBE_METRICS_PORT is 0: this worker serves no metrics", file=sys.stderr)
        return 1
    host = metrics_address(settings.METRICS_HOST, settings.REDIS_URL)
    url = f"http://{host}:{settings.METRICS_PORT}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 - this host's own address
        sys.stdout.write(answer.read().decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
