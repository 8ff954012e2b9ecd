"""The warm pool: an executor keeps sandboxes started ahead, so a task session starts without waiting.

A warm sandbox is a started container whose kernel answers and has already imported the common libraries
(``DEFAULT_WARM_IMPORTS``, or ``PBE_WARM_IMPORTS``: the import cost, not the names; the model's namespace stays
empty). ``take`` hands one
out and at once starts its replacement in a background thread (up to the pool's size, a few at a time). A
sandbox is handed out once and never returns to the pool: the session that took it removes it.

Docker labels are fixed when a container is created, so a warm sandbox is labelled for the pool
(``pybench-eval.evaluation=warm-pool``) rather than for the task it will serve, and for the worker that
started it (``pybench-eval.worker``); the session records the sandbox's id and name with its trajectory. A
worker killed outright leaves its sandboxes behind: the same worker, started again, removes them before it takes
work (``executor.worker``), and ``reap`` removes any by age.
"""

import contextlib
import contextvars
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, replace

from executor.kernel import KernelClient
from services.errors import SandboxError
from services.sandbox.base import SandboxBackend, SandboxSpec
from services.sandbox.contract import SandboxHandle

log = logging.getLogger(__name__)

POOL_EVALUATION = "warm-pool"
"""The evaluation label of sandboxes started ahead of the task they will serve."""

DEFAULT_WARM_IMPORTS: tuple[str, ...] = ()
"""Modules a warm kernel imports before any task, unless ``PBE_WARM_IMPORTS`` says otherwise: none. An import done
ahead is paid by every sandbox, and saves only the sessions that use it. pandas (with numpy), which PyBench's cells
use most, is imported by 65 of the 135 recorded sessions and costs a sandbox about 0.4 CPU-seconds; matplotlib.pyplot
(18 of 135) about 0.5. While the machine's cores bound a suite's run, each costs more than it saves; where the model's
latency bounds it (a GPU server, a hosted API) and the cores idle, ``PBE_WARM_IMPORTS=numpy,pandas`` takes the import
off the first cell that needs it."""

PREWARM_TIMEOUT_S = 60.0
"""How long a warm kernel may take to import its warm imports. A start under way is waited for up to the
spec's ready timeout plus this by ``take``, and up to this by ``close``."""


def prewarm_code(modules: tuple[str, ...] = DEFAULT_WARM_IMPORTS) -> str:
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


def start_sandbox(backend: SandboxBackend, spec: SandboxSpec, *, imports: tuple[str, ...] = ()) -> WarmSandbox:
    """Start a sandbox and its kernel, and have the kernel import ``imports`` (none: a cold kernel).

    Raises:
        SandboxStartError: the sandbox did not start (nothing is left behind).
        SandboxUnavailableError: its kernel did not start (the sandbox is removed).
    """
    handle = backend.start(spec)
    kernel = KernelClient(handle.url, handle.token, probe_scope=backend.telemetry_scope)
    try:
        kernel.start()
        if imports:
            kernel.run_silent(prewarm_code(imports), timeout_s=PREWARM_TIMEOUT_S)
    except BaseException:
        kernel.close(shutdown=False)
        backend.stop(handle)
        raise
    return WarmSandbox(handle, kernel, warm=False)


def _as_pool_spec(spec: SandboxSpec) -> SandboxSpec:
    """``spec`` as the pool starts it: of no session yet, in the background."""
    return replace(spec, evaluation_id=POOL_EVALUATION, task_index=0, attempt=0, background=True)


class WarmPool:
    """Keeps up to ``size`` sandboxes started ahead (per executor process), starting at most ``starts`` at once;
    thread-safe, for the many sessions an executor runs at once.

    ``template`` gives the image and limits; a ``take`` whose spec asks for other ones gets a sandbox started
    on demand instead. Sessions that find the pool empty wait for its next start rather than starting their own:
    a start is mostly CPU, so the pool's ``starts`` bound how many compete for the cores.
    """

    def __init__(
        self,
        backend: SandboxBackend,
        template: SandboxSpec,
        *,
        size: int = 1,
        starts: int = 1,
        imports: tuple[str, ...] = DEFAULT_WARM_IMPORTS,
    ) -> None:
        self.backend = backend
        self.template = _as_pool_spec(template)
        self.size = max(1, size)
        self.starts = max(1, starts)
        self.imports = imports
        self._ready_changed = threading.Condition()
        self._ready: deque[WarmSandbox] = deque()
        self._starting = 0
        self._threads: set[threading.Thread] = set()
        self._closed = False
        self._failing = False
        """The last start failed: takers stop waiting for the pool when nothing is starting."""
        self.last_error: str | None = None

    def _compatible(self, spec: SandboxSpec) -> bool:
        return _as_pool_spec(spec) == self.template

    @property
    def ready_count(self) -> int:
        """How many sandboxes are ready now."""
        with self._ready_changed:
            return len(self._ready)

    def fill(self) -> None:
        """Start sandboxes in the background until ``size`` are ready or starting (at most ``starts`` at once)."""
        with self._ready_changed:
            self._fill_locked()

    def _fill_locked(self) -> None:
        if self._closed:
            return
        wanted = min(self.size - len(self._ready) - self._starting, self.starts - self._starting)
        for _ in range(max(0, wanted)):
            self._starting += 1
            thread = threading.Thread(target=self._fill_one, name="pbe-warm-pool", daemon=True)
            self._threads.add(thread)
            thread.start()

    def _fill_one(self) -> None:
        try:
            sandbox: WarmSandbox | None = start_sandbox(self.backend, self.template, imports=self.imports)
            error = None
        except SandboxError as exc:
            sandbox, error = None, exc
        with self._ready_changed:
            self._starting -= 1
            self._threads.discard(threading.current_thread())
            kept = sandbox is not None and not self._closed
            if sandbox is not None and kept:
                self._ready.append(sandbox)
                self._failing = False
                self._fill_locked()  # on to the next, up to size
            elif error is not None:
                self._failing = True  # no refill here: the next take asks again, so a broken engine is not hammered
                self.last_error = str(error)
            self._ready_changed.notify_all()
        if error is not None:
            log.warning("warm pool: could not start a sandbox: %s", error)
        if sandbox is not None and not kept:  # closed meanwhile
            discard(self.backend, sandbox)

    def wait_ready(self, timeout_s: float, count: int = 1) -> bool:
        """Wait until ``count`` sandboxes are ready (for tests and benchmarks); True if they are."""
        deadline = time.monotonic() + timeout_s
        with self._ready_changed:
            while len(self._ready) < count:
                self._fill_locked()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._ready_changed.wait(min(remaining, 0.5))
            return True

    def take(self, spec: SandboxSpec) -> WarmSandbox:
        """Hand out a ready sandbox of the pool (checked alive first), waiting for the pool's next start when none
        is ready; or start one for ``spec`` when ``spec`` asks for other limits, or the pool cannot start any.
        Then start replacements in the background.

        Raises:
            SandboxStartError, SandboxUnavailableError: a sandbox could not be started on demand.
        """
        while self._compatible(spec):
            sandbox = self._next_ready(spec.ready_timeout_s + PREWARM_TIMEOUT_S)
            if sandbox is None:
                break
            try:
                self.backend.promote(sandbox.handle)  # a session's share of the CPU from now on
                sandbox.kernel.run_silent("", timeout_s=5.0)  # still alive?
            except SandboxError as exc:
                log.warning("warm pool: sandbox %s went away while waiting: %s", sandbox.handle.name, exc)
                discard(self.backend, sandbox)
                continue
            sandbox.warm = True
            self.fill()
            return sandbox
        self.fill()
        return start_sandbox(self.backend, spec)

    def _next_ready(self, timeout_s: float) -> WarmSandbox | None:
        """The oldest ready sandbox, waiting up to ``timeout_s`` for one while starts are under way; None when
        the pool is closed, failing with nothing starting, or the wait ran out."""
        deadline = time.monotonic() + timeout_s
        with self._ready_changed:
            while not self._ready:
                if self._closed or (self._failing and self._starting == 0):
                    return None  # a failing pool is retried by ``fill`` after the caller's own start
                if not self._failing:
                    self._fill_locked()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._ready_changed.wait(remaining)
            return self._ready.popleft()

    def close(self) -> None:
        """Remove the ready sandboxes and stop filling; starts under way are removed when they finish."""
        with self._ready_changed:
            self._closed = True
            ready, self._ready = list(self._ready), deque()
            threads = list(self._threads)
            self._ready_changed.notify_all()
        for sandbox in ready:
            discard(self.backend, sandbox)
        deadline = time.monotonic() + PREWARM_TIMEOUT_S
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


def discard(backend: SandboxBackend, sandbox: WarmSandbox) -> None:
    """Close the sandbox's kernel channels and remove the sandbox (which ends the kernel); never raises for a
    sandbox already gone."""
    with contextlib.suppress(SandboxError):
        sandbox.kernel.close(shutdown=False)
    backend.stop(sandbox.handle)


SESSION_POOL: contextvars.ContextVar[WarmPool | None] = contextvars.ContextVar("pbe_session_pool", default=None)
"""The warm pool a session job takes its sandbox from. The worker that owns the pool (``executor.worker``) sets it
in each session's thread before running the job; elsewhere (a plain rq worker, a test calling the job) it is
unset and the job starts its own sandbox."""
