"""The grader's RQ worker: RQ's forking worker (each grading in a child process of its own) with a short heartbeat,
its Prometheus series and the judge's prompt hashes advertised for the runs' manifests.

While a grading runs, the worker checks on its child every ``DEFAULT_HEARTBEAT_INTERVAL_S`` and renews its
heartbeat for ``DEFAULT_HEARTBEAT_TTL_S`` (``services.live.liveness``), so a grader killed as a grading starts is dead
to
the reconciler within seconds, not after RQ's ninety, and its grading is queued again. The grading's time and
status are counted here, in the parent, when the child has ended (a child's counters would die with it).

Run as ``rq worker --worker-class grader.worker.GraderWorker --serializer rq.serializers.JSONSerializer
pbe-grading``.
"""

import time
from typing import Any

from rq.job import Job
from rq.queue import Queue
from rq.worker import Worker

from grader.judge.prompts import prompt_hash
from grader.settings import GraderSettings
from services.live.components import advertise, judge_prompt_key
from services.live.liveness import DEFAULT_HEARTBEAT_INTERVAL_S, ShortHeartbeat
from services.observability.logs import configure_logging
from services.observability.monitoring import metrics_address, record_grading, serve_worker_metrics
from services.queues import ProjectJobsOnly
from services.verdict import JudgeMode


class GraderWorker(ProjectJobsOnly, ShortHeartbeat, Worker):
    """RQ's ``Worker`` whose heartbeat dies with it within ``DEFAULT_HEARTBEAT_TTL_S``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.job_monitoring_interval = int(DEFAULT_HEARTBEAT_INTERVAL_S)

    def work(self, *args: Any, **kwargs: Any) -> bool:
        """Serve the series (``PBE_METRICS_PORT``), advertise the judge's prompt hashes, then take gradings."""
        settings = GraderSettings()
        configure_logging(level=kwargs.get("logging_level") or "INFO")
        serve_worker_metrics(settings.METRICS_PORT, metrics_address(settings.METRICS_HOST, settings.REDIS_URL))
        try:
            advertise(self.connection, {judge_prompt_key(m.value): prompt_hash(m) for m in JudgeMode})
        except Exception as exc:  # Redis away at start: the manifests say "unknown" until the next start
            self.log.warning("could not advertise the judge's prompt hashes: %s", exc)
        return bool(super().work(*args, **kwargs))

    def execute_job(self, job: Job, queue: Queue) -> None:
        started = time.monotonic()
        try:
            super().execute_job(job, queue)
        finally:
            record_grading(time.monotonic() - started, _outcome(job))


def _outcome(job: Job) -> str:
    """The verdict's status the grading returned, else ``error`` (it failed, or its child died)."""
    try:
        result = job.latest_result()
        value = result.return_value if result is not None else None
        return str(value.get("status", "error")) if isinstance(value, dict) else "error"
    except Exception:
        return "error"
