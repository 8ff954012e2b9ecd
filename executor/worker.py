"""The executor's RQ worker: runs session jobs in its own process, beside a warm pool of sandboxes.

RQ's default worker forks a child per job, so nothing a job starts outlives it. Sessions need the opposite:
the next sandbox is started while the current session runs, and handed to the next job. ``ExecutorWorker``
runs jobs in the worker process (RQ's ``SimpleWorker``) and owns the process's ``WarmPool``, filled when the
worker starts and emptied when it stops (a worker killed outright leaves its warm sandbox to ``reap``).

Run as ``rq worker --worker-class executor.worker.ExecutorWorker --serializer rq.serializers.JSONSerializer
pbe-sessions``.
"""

import logging
from typing import Any

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


class ExecutorWorker(SimpleWorker):
    """An RQ worker that runs jobs in-process and keeps a warm sandbox ready between them."""

    def work(self, *args: Any, **kwargs: Any) -> bool:
        open_pool(ExecutorSettings())
        try:
            return bool(super().work(*args, **kwargs))
        finally:
            close_pool()
