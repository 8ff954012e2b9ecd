"""The executor's RQ worker: runs session jobs in its own process, beside a warm pool of sandboxes.

RQ's default worker forks a child per job, so nothing a job starts outlives it. Sessions need the opposite:
the next sandbox is started while the current session runs, and handed to the next job. ``ExecutorWorker``
runs jobs in the worker process (RQ's ``SimpleWorker``) and owns the process's ``WarmPool``, filled when the
worker starts and emptied when it stops (a worker killed outright leaves its warm sandbox to ``reap``). A thread
beats the worker's heartbeat every few seconds with a short time to live, so a worker killed in the middle of a
session is seen dead (its ``rq:worker:<name>`` key gone) within ``DEFAULT_HEARTBEAT_TTL_S`` and the gateway's
reconciler queues its session again.

Run as ``rq worker --worker-class executor.worker.ExecutorWorker --serializer rq.serializers.JSONSerializer
pbe-sessions``.
"""

import logging
import threading
from typing import Any

from redis.exceptions import RedisError
from rq.worker import SimpleWorker

from executor.pool import POOL_EVALUATION, WarmPool
from executor.sandboxes.registry import get_backend
from executor.settings import ExecutorSettings

log = logging.getLogger(__name__)

_pool: WarmPool | None = None


def current_pool() -> WarmPool | None:
    """The process's warm pool, when this process is an ``ExecutorWorker`` with the pool on."""
    return _pool


def open_pool(settings: ExecutorSettings) -> WarmPool | None:
    """Create the process's warm pool (if ``PBE_WARM_POOL`` is on) and start filling it.

    Raises:
        ConfigurationError: the sandbox backend is unknown.
    """
    global _pool
    if _pool is None and settings.WARM_POOL:
        _pool = WarmPool(get_backend(settings), settings.sandbox_spec(POOL_EVALUATION, 0, 0))
        _pool.fill()
    return _pool


def close_pool() -> None:
    """Remove the pool's ready sandbox and stop filling it."""
    global _pool
    if _pool is not None:
        _pool.close()
        _pool = None


DEFAULT_HEARTBEAT_INTERVAL_S = 5.0
"""How often a worker says it is alive, also while a session runs."""

DEFAULT_HEARTBEAT_TTL_S = 20
"""A worker that has not said so for this long is dead: its ``rq:worker:<name>`` key expires, and the reconciler
queues its session again (RQ alone keeps that key for the job's whole timeout, an hour, while a job runs)."""


class ExecutorWorker(SimpleWorker):
    """An RQ worker that runs jobs in-process, keeps a warm sandbox ready between them, and beats a short
    heartbeat from a thread of its own, so that its death is seen within ``DEFAULT_HEARTBEAT_TTL_S``."""

    def work(self, *args: Any, **kwargs: Any) -> bool:
        open_pool(ExecutorSettings())
        stop = threading.Event()
        beat = threading.Thread(target=self._beat, args=(stop,), name="pbe-heartbeat", daemon=True)
        beat.start()
        try:
            return bool(super().work(*args, **kwargs))
        finally:
            stop.set()
            close_pool()

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        """RQ's heartbeat, with this worker's short time to live whatever RQ asks (it asks for the job's timeout
        when a job starts)."""
        super().heartbeat(DEFAULT_HEARTBEAT_TTL_S, pipeline)

    def _beat(self, stop: threading.Event) -> None:
        while not stop.wait(DEFAULT_HEARTBEAT_INTERVAL_S):
            try:
                if self.connection.exists(self.key):
                    self.heartbeat()
            except RedisError as exc:  # Redis is away: the worker's main loop decides what that means
                log.warning("heartbeat skipped: %s", exc)
