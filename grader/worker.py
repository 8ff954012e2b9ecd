"""The grader's RQ worker: RQ's forking worker (each grading in a child process of its own) with a short heartbeat.

While a grading runs, the worker checks on its child every ``DEFAULT_HEARTBEAT_INTERVAL_S`` and renews its
heartbeat for ``DEFAULT_HEARTBEAT_TTL_S`` (``services.liveness``), so a grader killed as a grading starts is dead to
the reconciler within seconds, not after RQ's ninety, and its grading is queued again.

Run as ``rq worker --worker-class grader.worker.GraderWorker --serializer rq.serializers.JSONSerializer
pbe-grading``.
"""

from typing import Any

from rq.worker import Worker

from services.liveness import DEFAULT_HEARTBEAT_INTERVAL_S, ShortHeartbeat


class GraderWorker(ShortHeartbeat, Worker):
    """RQ's ``Worker`` whose heartbeat dies with it within ``DEFAULT_HEARTBEAT_TTL_S``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.job_monitoring_interval = int(DEFAULT_HEARTBEAT_INTERVAL_S)
