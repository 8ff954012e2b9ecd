"""The sandbox interface: start a box running a kernel gateway, move files in and out, stop it, reap orphans.

A sandbox is used by one task session and destroyed after it; it is never handed to another task.
Running cells is not the backend's job: every backend exposes a kernel gateway (``SandboxHandle.url`` and
``token``) and ``executor.kernel.KernelClient`` talks to it, whatever the backend.
"""

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass

from services.sandbox import SandboxHandle

DEFAULT_MEMORY_MB = 2048
"""A sandbox's memory limit (no swap), unless ``PBE_SANDBOX_MEMORY_MB`` says otherwise."""

DEFAULT_CPUS = 1.0
"""A sandbox's CPU limit, unless ``PBE_SANDBOX_CPUS`` says otherwise."""

DEFAULT_PIDS = 512
"""A sandbox's process and thread limit, unless ``PBE_SANDBOX_PIDS`` says otherwise."""

DEFAULT_READY_TIMEOUT_S = 60.0
"""How long a sandbox's kernel gateway may take to answer, unless ``PBE_SANDBOX_READY_TIMEOUT_S`` says otherwise."""


@dataclass(frozen=True)
class SandboxSpec:
    """What a session asks of its sandbox; a worker makes it with ``ExecutorSettings.sandbox_spec``."""

    evaluation_id: str
    task_index: int
    attempt: int
    image: str
    memory_mb: int = DEFAULT_MEMORY_MB
    cpus: float = DEFAULT_CPUS
    pids: int = DEFAULT_PIDS
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S
    workspace_mb: int = 1024
    """Size cap of the writable ``/workspace`` (inputs and outputs); the root filesystem is read-only."""
    tmp_mb: int = 256
    """Size cap of each of the writable ``/tmp`` and home folders."""


class SandboxBackend(ABC):
    """A way of running sandboxes. Implementations import their SDK lazily."""

    name: str
    telemetry_scope: str = "process"
    """Whose CPU and memory the per-cell probe measures: ``cgroup`` (the whole sandbox) or ``process`` (the
    kernel process), see ``executor.probe``."""

    @abstractmethod
    def start(self, spec: SandboxSpec) -> SandboxHandle:
        """Start a sandbox and wait until its kernel gateway answers.

        Raises:
            SandboxStartError: the sandbox could not be started or did not become ready in time (it is
                removed before this is raised).
        """

    @abstractmethod
    def put_file(self, handle: SandboxHandle, dest: str, data: bytes) -> None:
        """Write a file into the sandbox at ``dest`` (absolute, e.g. ``/workspace/data/a.csv``).

        Raises:
            SandboxUnavailableError: the sandbox is gone.
        """

    @abstractmethod
    def get_tree(self, handle: SandboxHandle, path: str) -> dict[str, bytes]:
        """Return the regular files under the sandbox folder ``path``, keyed by path relative to it, and each
        folder under it that holds none of them as ``name/`` with empty content (an empty folder is a result:
        "save the files to a folder ./output/140/").

        Symbolic links and special files are skipped. A missing folder gives an empty dict.

        Raises:
            SandboxUnavailableError: the sandbox is gone.
        """

    @abstractmethod
    def stop(self, handle: SandboxHandle) -> None:
        """Destroy the sandbox and everything in it. Best effort: never raises for a sandbox already gone."""

    @abstractmethod
    def reap(self, evaluation_id: str | None = None, older_than_s: float = 0.0) -> list[str]:
        """Remove leftover sandboxes of this project (of one evaluation, or all) created more than
        ``older_than_s`` seconds ago, with everything they own; return their names."""


def with_empty_folders(files: dict[str, bytes], folders: Iterable[str]) -> dict[str, bytes]:
    """Add to ``files`` (relative names) each of ``folders`` (relative, without a trailing ``/``) that holds no
    file or folder of them, as ``name/`` with empty content; return ``files``."""
    names = list(files)
    folders = [folder.strip("/") for folder in folders if folder.strip("/") not in ("", ".")]
    occupied = {name.rsplit("/", 1)[0] for name in names + folders if "/" in name}
    for folder in folders:
        if folder not in occupied:
            files[folder + "/"] = b""
    return files
