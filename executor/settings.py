"""The executor's settings (``PBE_`` environment variables), validated when the worker starts."""

from executor.sandboxes.base import (
    DEFAULT_CPUS,
    DEFAULT_MEMORY_MB,
    DEFAULT_PIDS,
    DEFAULT_READY_TIMEOUT_S,
    SandboxSpec,
)
from services.sandbox import DEFAULT_SANDBOX_IMAGE
from services.settings import ServiceSettings

DEFAULT_SANDBOX_NETWORK = "pybench-eval-sandboxes"
"""The internal Docker network sandboxes join: no route out; only the executor reaches their gateway."""


class ExecutorSettings(ServiceSettings):
    SANDBOX_BACKEND: str = "docker"
    """``docker`` (isolated containers) or ``local`` (a kernel gateway subprocess, no isolation: development only)."""
    SANDBOX_IMAGE: str = DEFAULT_SANDBOX_IMAGE
    SANDBOX_NETWORK: str = DEFAULT_SANDBOX_NETWORK
    SANDBOX_MEMORY_MB: int = DEFAULT_MEMORY_MB
    SANDBOX_CPUS: float = DEFAULT_CPUS
    SANDBOX_PIDS: int = DEFAULT_PIDS
    SANDBOX_READY_TIMEOUT_S: float = DEFAULT_READY_TIMEOUT_S
    SANDBOX_LOCAL_ROOT: str | None = None
    """Where the local backend makes its sandbox folders; unset: the system's temporary folder."""
    MODEL_TIMEOUT_S: float = 300.0
    WARM_POOL: bool = True
    """Keep the next sandbox started (``executor.worker.ExecutorWorker``); off: start each on demand."""

    def sandbox_spec(self, evaluation_id: str, task_index: int, attempt: int) -> SandboxSpec:
        """The sandbox one task session (or the warm pool) asks for: these settings' image and limits, under the
        labels of ``evaluation_id``, ``task_index`` and ``attempt``. Every caller builds its spec here."""
        return SandboxSpec(
            evaluation_id=evaluation_id,
            task_index=task_index,
            attempt=attempt,
            image=self.SANDBOX_IMAGE,
            memory_mb=self.SANDBOX_MEMORY_MB,
            cpus=self.SANDBOX_CPUS,
            pids=self.SANDBOX_PIDS,
            ready_timeout_s=self.SANDBOX_READY_TIMEOUT_S,
        )
