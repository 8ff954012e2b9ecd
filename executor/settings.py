"""The executor's settings (``PBE_`` environment variables), validated when the worker starts."""

from services.settings import ServiceSettings

DEFAULT_SANDBOX_IMAGE = "pybench-eval/sandbox:latest"
"""The image every sandbox runs (built by ``make images``)."""

DEFAULT_SANDBOX_NETWORK = "pybench-eval-sandboxes"
"""The internal Docker network sandboxes join: no route out; only the executor reaches their gateway."""


class ExecutorSettings(ServiceSettings):
    SANDBOX_BACKEND: str = "docker"
    """``docker`` (isolated containers) or ``local`` (a kernel gateway subprocess, no isolation: development only)."""
    SANDBOX_IMAGE: str = DEFAULT_SANDBOX_IMAGE
    SANDBOX_NETWORK: str = DEFAULT_SANDBOX_NETWORK
    SANDBOX_MEMORY_MB: int = 2048
    SANDBOX_CPUS: float = 1.0
    SANDBOX_PIDS: int = 512
    SANDBOX_READY_TIMEOUT_S: float = 60.0
    SANDBOX_LOCAL_ROOT: str | None = None
    """Where the local backend makes its sandbox folders; unset: the system's temporary folder."""
    MODEL_TIMEOUT_S: float = 300.0
    WARM_POOL: bool = True
    """Keep the next sandbox started (``executor.worker.ExecutorWorker``); off: start each on demand."""
