"""The executor's settings (``PBE_`` environment variables), validated when the worker starts."""

import os
import socket
from pathlib import Path

from pydantic import Field

from executor.pool import DEFAULT_WARM_IMPORTS
from services.endpoint.client import DEFAULT_DEADLINE_S, DEFAULT_MAX_REPLY_BYTES
from services.sandbox.base import (
    DEFAULT_CPUS,
    DEFAULT_MEMORY_MB,
    DEFAULT_PIDS,
    DEFAULT_READY_TIMEOUT_S,
    SandboxSpec,
)
from services.sandbox.contract import DEFAULT_SANDBOX_IMAGE, RuntimeVolumeMode
from services.sandbox.k8s_pods import DEFAULT_NAMESPACE as DEFAULT_K8S_NAMESPACE
from services.settings import ServiceSettings

DEFAULT_SESSIONS_PER_WORKER = 16
"""Sessions one executor process runs at once, unless ``PBE_SESSIONS_PER_WORKER`` says otherwise."""

DEFAULT_WARM_POOL_SIZE = 4
"""Started sandboxes an executor keeps ready, unless ``PBE_WARM_POOL_SIZE`` says otherwise."""

DEFAULT_WARM_POOL_STARTS = 2
"""Sandboxes an executor's warm pool starts at once, unless ``PBE_WARM_POOL_STARTS`` says otherwise."""

_MODULE_LIST = r"^\s*([A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\s*(,\s*|$))*$"
"""Comma-separated dotted module names (or nothing)."""

DEFAULT_SANDBOX_NETWORK = "pybench-eval-sandboxes"
"""The internal Docker network sandboxes join: no route out; only the executor reaches their gateway."""


def default_worker_id() -> str:
    """The host name in a container (a restarted container, or a pod's container, keeps it: its next life finds
    what it left); on a bare host, where several workers may run, the host name and the process id."""
    in_container = Path("/.dockerenv").exists() or "KUBERNETES_SERVICE_HOST" in os.environ
    host = socket.gethostname()[:40] or "worker"
    return host if in_container else f"{host}-{os.getpid()}"


class ExecutorSettings(ServiceSettings):
    SANDBOX_BACKEND: str = "docker"
    """``docker`` (isolated containers), ``kubernetes`` (a pod per session) or ``local`` (a kernel gateway
    subprocess, no isolation: development only)."""
    SANDBOX_IMAGE: str = DEFAULT_SANDBOX_IMAGE
    SANDBOX_NETWORK: str = DEFAULT_SANDBOX_NETWORK
    SANDBOX_RUNTIME_VOLUME: RuntimeVolumeMode = "auto"
    """Serve the image's ``/opt/venv`` and ``/usr`` to Docker sandboxes from read-only volumes: ``auto`` (where the
    engine's storage driver is FUSE), ``on`` or ``off`` (``services.sandbox.runtime_volumes``)."""
    SANDBOX_MEMORY_MB: int = DEFAULT_MEMORY_MB
    SANDBOX_CPUS: float = DEFAULT_CPUS
    SANDBOX_PIDS: int = DEFAULT_PIDS
    SANDBOX_READY_TIMEOUT_S: float = DEFAULT_READY_TIMEOUT_S
    SANDBOX_LOCAL_ROOT: str | None = None
    """Where the local backend makes its sandbox folders; unset: the system's temporary folder."""
    K8S_NAMESPACE: str = DEFAULT_K8S_NAMESPACE
    """The namespace of the kubernetes backend's sandbox pods."""
    K8S_RUNTIME_CLASS: str = ""
    """A RuntimeClass for the sandbox pods (``gvisor``); empty: the cluster's default."""
    MODEL_TIMEOUT_S: float = 300.0
    """Seconds one read of the model endpoint's answer may wait (``services.endpoint.client``)."""
    MODEL_DEADLINE_S: float = Field(default=DEFAULT_DEADLINE_S, gt=0)
    """Seconds one request to the model endpoint may take in all, however its answer trickles in."""
    MODEL_MAX_REPLY_BYTES: int = Field(default=DEFAULT_MAX_REPLY_BYTES, gt=0)
    """The most bytes of one model answer read; a larger one ends the session ``model_error``, naming this."""
    WARM_POOL: bool = True
    """Keep sandboxes started ahead of the sessions (``executor.worker.ExecutorWorker``); off: start each on demand."""
    SESSIONS_PER_WORKER: int = Field(default=DEFAULT_SESSIONS_PER_WORKER, ge=1, le=256)
    """How many sessions one executor process runs at once, each in a thread of its own (they wait on the model
    and the kernel most of the time)."""
    WARM_POOL_SIZE: int = Field(default=DEFAULT_WARM_POOL_SIZE, ge=1, le=64)
    """How many started sandboxes the warm pool keeps ready."""
    WARM_IMPORTS: str = Field(default=",".join(DEFAULT_WARM_IMPORTS), pattern=_MODULE_LIST)
    """The modules a warm sandbox's kernel imports before its task, comma-separated (``numpy,pandas``; empty:
    none): the cost moves off the cells that use them, and every sandbox pays it."""
    WARM_POOL_STARTS: int = Field(default=DEFAULT_WARM_POOL_STARTS, ge=1, le=16)
    """How many sandboxes the warm pool starts at once (each start is mostly CPU: more only queue on the cores)."""
    WORKER_ID: str = Field(default_factory=lambda: default_worker_id(), pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    """Who started a sandbox: its ``pybench-eval.worker`` label. The same worker started again removes what its
    previous life left before it takes work (``default_worker_id``)."""

    @property
    def warm_imports(self) -> tuple[str, ...]:
        """``WARM_IMPORTS`` as module names."""
        return tuple(name.strip() for name in self.WARM_IMPORTS.split(",") if name.strip())

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
            worker=self.WORKER_ID,
        )
