"""The warm pool: an executor keeps its next sandbox started, so a task session starts without waiting.

A warm sandbox is a started container whose kernel answers and has already imported the common libraries
(``PREWARM_IMPORTS``: the import cost, not the names; the model's namespace stays empty). ``take`` hands it
out and at once starts its replacement in a background thread. A sandbox is handed out once and never
returns to the pool: the session that took it removes it.

Docker labels are fixed when a container is created, so a warm sandbox is labelled for the pool
(``pybench-eval.evaluation=warm-pool``) rather than for the task it will serve; the session records the
sandbox's id and name with its trajectory. A pool that dies uncleanly leaves sandboxes that ``reap`` removes
by age.
"""

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, replace

from executor.kernel import KernelClient
from executor.sandboxes.base import SandboxBackend, SandboxSpec
from services.errors import SandboxError
from services.sandbox import SandboxHandle

log = logging.getLogger(__name__)

POOL_EVALUATION = "warm-pool"
"""The evaluation label of sandboxes started ahead of the task they will serve."""

PREWARM_IMPORTS = ("numpy", "pandas", "matplotlib", "matplotlib.pyplot")
"""Modules a warm kernel imports before any task: the first cells of most PyBench tasks need them."""

PREWARM_TIMEOUT_S = 60.0
"""How long a warm kernel may take to import ``PREWARM_IMPORTS``. A start under way is waited for up to the
spec's ready timeout plus this by ``take``, and up to this by ``close``."""


def prewarm_code(modules: tuple[str, ...] = PREWARM_IMPORTS) -> str:
    """Code that imports ``modules`` (each optional) without binding a name in the user's namespace."""
    lines = [f"try:\n    __import__({name!r})\nexcept Exception:\n    pass" for name in modules]
    return "exec(" + repr("\n".join(lines)) + ", {})"


@dataclass
class WarmSandbox:
    """A started sandbox and its started kernel, ready for one task session."""

    handle: SandboxHandle
    kernel: KernelClient
    warm: bool
    """True if it came from the pool, False if it was started on demand."""


def start_sandbox(backend: SandboxBackend, spec: SandboxSpec, *, prewarm: bool) -> WarmSandbox:
    """Start a sandbox and its kernel (optionally importing ``PREWARM_IMPORTS``).

    Raises:
        SandboxStartError: the sandbox did not start (nothing is left behind).
        SandboxUnavailableError: its kernel did not start (the sandbox is removed).
    """
    handle = backend.start(spec)
    kernel = KernelClient(handle.url, handle.token, probe_scope=backend.telemetry_scope)
    try:
        kernel.start()
        if prewarm:
            kernel.run_silent(prewarm_code(), timeout_s=PREWARM_TIMEOUT_S)
    except BaseException:
        kernel.close()
        backend.stop(handle)
        raise
    return WarmSandbox(handle, kernel, warm=False)


class WarmPool:
    """Keeps one sandbox started ahead (per executor process); thread-safe.

    ``template`` gives the image and limits; a ``take`` whose spec asks for other ones gets a sandbox started
    on demand instead.
    """

    def __init__(self, backend: SandboxBackend, template: SandboxSpec, *, prewarm: bool = True) -> None:
        self.backend = backend
        self.template = replace(template, evaluation_id=POOL_EVALUATION, task_index=0, attempt=0)
        self.prewarm = prewarm
        self._lock = threading.Lock()
        self._ready: WarmSandbox | None = None
        self._filling: threading.Thread | None = None
        self._closed = False
        self.last_error: str | None = None

    def _compatible(self, spec: SandboxSpec) -> bool:
        return replace(spec, evaluation_id=POOL_EVALUATION, task_index=0, attempt=0) == self.template

    def fill(self) -> None:
        """Start the next sandbox in the background, unless one is ready or starting."""
        with self._lock:
            if self._closed or self._ready is not None or (self._filling is not None and self._filling.is_alive()):
                return
            self._filling = threading.Thread(target=self._fill, name="pbe-warm-pool", daemon=True)
            self._filling.start()

    def _fill(self) -> None:
        try:
            sandbox = start_sandbox(self.backend, self.template, prewarm=self.prewarm)
        except SandboxError as exc:
            self.last_error = str(exc)
            log.warning("warm pool: could not start a sandbox: %s", exc)
            return
        with self._lock:
            kept = not self._closed
            if kept:
                self._ready = sandbox
        if not kept:  # closed meanwhile
            _discard(self.backend, sandbox)

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait until a sandbox is ready (for tests and benchmarks); True if one is."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if self._ready is not None:
                    return True
                filling = self._filling
            if filling is None or not filling.is_alive():
                self.fill()
            time.sleep(0.01)
        return False

    def take(self, spec: SandboxSpec) -> WarmSandbox:
        """Hand out the pool's sandbox (checked alive first; if it is still starting, wait for it), or start one
        for ``spec`` when the pool has none or ``spec`` asks for other limits; then start the next one in the
        background.

        Raises:
            SandboxStartError, SandboxUnavailableError: a sandbox could not be started on demand.
        """
        compatible = self._compatible(spec)
        with self._lock:
            filling = self._filling
        if compatible and filling is not None and filling.is_alive():
            filling.join(timeout=spec.ready_timeout_s + PREWARM_TIMEOUT_S)  # a start under way is ahead of a new one
        with self._lock:
            sandbox, self._ready = (self._ready, None) if compatible else (None, self._ready)
        if sandbox is not None:
            try:
                sandbox.kernel.run_silent("", timeout_s=5.0)  # still alive?
            except SandboxError as exc:
                log.warning("warm pool: sandbox %s went away while waiting: %s", sandbox.handle.name, exc)
                _discard(self.backend, sandbox)
                sandbox = None
        if sandbox is not None:
            sandbox.warm = True
            self.fill()
            return sandbox
        self.fill()
        return start_sandbox(self.backend, spec, prewarm=False)

    def close(self) -> None:
        """Remove the ready sandbox and stop filling; a start under way is removed when it finishes."""
        with self._lock:
            self._closed = True
            sandbox, self._ready = self._ready, None
            filling = self._filling
        if sandbox is not None:
            _discard(self.backend, sandbox)
        if filling is not None:
            filling.join(timeout=PREWARM_TIMEOUT_S)


def _discard(backend: SandboxBackend, sandbox: WarmSandbox) -> None:
    with contextlib.suppress(SandboxError):
        sandbox.kernel.close()
    backend.stop(sandbox.handle)
