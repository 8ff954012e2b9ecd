"""The executor's RQ worker: many task sessions at once in one process, beside a warm pool of sandboxes.

A session spends its time waiting on the model and on the kernel, so one process runs many:
``ExecutorWorker`` takes a job from the queue whenever one of its ``PBE_SESSIONS_PER_WORKER`` slots is free and
runs it in a thread of its own (RQ's own job bookkeeping, one execution record per job; timeouts by timer, as
signals reach only the main thread). It owns the process's ``WarmPool`` (``PBE_WARM_POOL_SIZE`` sandboxes
kept ready), filled when the worker starts and emptied when it stops, and hands it to each session's thread
(``executor.pool.SESSION_POOL``, a context variable the job reads): no module holds it.

What keeps it honest when things break:

- **Its death is seen fast.** A thread beats the worker's heartbeat every ``DEFAULT_HEARTBEAT_INTERVAL_S`` with
  a short time to live (``services.live.liveness``), so a worker killed mid-session is dead (its ``rq:worker:<name>``
  key gone) within ``DEFAULT_HEARTBEAT_TTL_S`` and the gateway's reconciler queues its sessions again.
- **It rides out a Redis outage.** Its connection retries every command for about a minute
  (``services.settings.redis_retry``), and its loop waits for Redis to come back instead of quitting.
- **It cleans up after its previous life.** Sandboxes carry the worker's id (``PBE_WORKER_ID``, the host name
  by default: the same container restarted); before it takes work it removes the ones that id left behind.
- **It takes no session it cannot run.** Before each job it asks the sandbox backend whether it can start
  sandboxes (``SandboxBackend.problem``); while it cannot, it says why and waits, with a backoff, instead of
  burning the attempts of the tasks in the queue.
- **A retry waits outside its slots.** A session that ends on a retryable infrastructure reason schedules its next
  attempt (``services.lifecycle``); a thread of every worker queues the retries whose delay is over, every
  ``RELEASE_INTERVAL_S``, so no slot sleeps through a delay.
- **It stops gracefully.** On SIGTERM it takes no more jobs and waits for its running sessions to end (the
  container's stop grace period bounds that); a second signal stops it at once.

Run as ``rq worker --worker-class executor.worker.ExecutorWorker --serializer rq.serializers.JSONSerializer
pbe-sessions``.
"""

import logging
import threading
import time
from typing import Any

from redis.exceptions import RedisError
from rq.exceptions import DequeueTimeout, StopRequested
from rq.job import Job
from rq.queue import Queue
from rq.timeouts import TimerDeathPenalty
from rq.worker import SimpleWorker, WorkerStatus

from executor.pool import POOL_EVALUATION, SESSION_POOL, WarmPool
from executor.settings import ExecutorSettings
from services.live.components import SANDBOX_IMAGE, advertise
from services.live.liveness import DEFAULT_HEARTBEAT_INTERVAL_S, ShortHeartbeat
from services.observability.logs import configure_logging
from services.observability.monitoring import SESSIONS_IN_FLIGHT, metrics_address, serve_worker_metrics
from services.queues import RETRIES_KEY, ProjectJobsOnly, release_due_sessions
from services.sandbox.base import SandboxBackend
from services.sandbox.registry import get_backend
from services.settings import redis_retry

log = logging.getLogger(__name__)


def open_pool(settings: ExecutorSettings, backend: SandboxBackend) -> WarmPool | None:
    """The process's warm pool (when ``PBE_WARM_POOL`` is on), filling; None when it is off."""
    if not settings.WARM_POOL:
        return None
    pool = WarmPool(
        backend,
        settings.sandbox_spec(POOL_EVALUATION, 0, 0),
        size=settings.WARM_POOL_SIZE,
        starts=settings.WARM_POOL_STARTS,
        imports=settings.warm_imports,
    )
    pool.fill()
    return pool


DEFAULT_DEQUEUE_WAIT_S = 2
"""How long one wait for a job blocks, so that a stop request or a changed backend is seen soon."""

RELEASE_INTERVAL_S = 1.0
"""How often a worker queues the retries whose delay is over."""

DEFAULT_BACKOFF_MAX_S = 30.0
"""The longest wait between two checks of an unreachable Redis or sandbox backend."""


class ExecutorWorker(ProjectJobsOnly, ShortHeartbeat, SimpleWorker):
    """An RQ worker that runs up to ``PBE_SESSIONS_PER_WORKER`` jobs at once in threads of its own (see the
    module's description)."""

    death_penalty_class = TimerDeathPenalty

    def work(  # type: ignore[override]
        self,
        burst: bool = False,
        logging_level: str | None = "INFO",
        date_format: str = "%H:%M:%S",
        log_format: str = "%(asctime)s %(message)s",
        max_jobs: int | None = None,
        **_: Any,
    ) -> bool:
        """Take and run jobs until stopped (or, in ``burst`` mode, until the queue is empty and every session has
        ended). Returns whether any job was taken."""
        settings = ExecutorSettings()
        self.connection.set_retry(redis_retry())
        self._slots = threading.BoundedSemaphore(settings.SESSIONS_PER_WORKER)
        self._sessions: set[threading.Thread] = set()
        self._sessions_lock = threading.Lock()
        backend = get_backend(settings)
        _sweep(backend, settings.WORKER_ID)
        configure_logging(level=logging_level or "INFO")  # first: RQ's own lines then take its format too
        self.bootstrap(logging_level, date_format, log_format)
        serve_worker_metrics(settings.METRICS_PORT, metrics_address(settings.METRICS_HOST, settings.REDIS_URL))
        self._quietly(
            lambda: advertise(self.connection, {SANDBOX_IMAGE: backend.image_reference(settings.SANDBOX_IMAGE)})
        )
        self._install_signal_handlers()  # type: ignore[no-untyped-call]
        self._pool = open_pool(settings, backend)
        stop = threading.Event()
        beat = threading.Thread(target=self._beat, args=(stop,), name="pbe-heartbeat", daemon=True)
        beat.start()
        threading.Thread(target=self._release, args=(stop,), name="pbe-retries", daemon=True).start()
        taken = 0
        try:
            taken = self._take_jobs(backend, burst, max_jobs)
            self._drain()  # a second stop signal (SystemExit) leaves without waiting
        finally:
            stop.set()
            if self._pool is not None:
                self._pool.close()
            self._quietly(self.teardown)
        return taken > 0

    def _take_jobs(self, backend: SandboxBackend, burst: bool, max_jobs: int | None) -> int:
        """The main loop: wait for a free slot and a working backend, take a job, start its thread. Returns how
        many jobs it took."""
        taken = 0
        backoff = _Backoff()
        while not self._stop_requested and (max_jobs is None or taken < max_jobs):
            if not self._slots.acquire(timeout=1.0):
                continue
            started = False
            try:
                problem = backend.problem()
                if problem is not None:
                    delay = backoff.next()
                    log.error("not taking sessions: %s (checking again in %.0f s)", problem, delay)
                    time.sleep(delay)
                    continue
                result = self.dequeue_job_and_maintain_ttl(
                    None if burst else DEFAULT_DEQUEUE_WAIT_S, max_idle_time=None if burst else DEFAULT_DEQUEUE_WAIT_S
                )
                backoff.reset()
                if result is None:
                    if burst and self._running() == 0 and self._queues_empty():
                        break
                    if burst:
                        time.sleep(0.2)  # sessions still running may admit more work
                    continue
                self._start(*result)
                started = True
                taken += 1
            except StopRequested:
                break
            except (RedisError, DequeueTimeout) as exc:
                delay = backoff.next()
                log.warning("Redis is away (%s); waiting %.0f s for it", exc, delay)
                time.sleep(delay)
            finally:
                if not started:
                    self._slots.release()
        return taken

    def _start(self, job: Job, queue: Queue) -> None:
        """Run ``job`` in a thread of its own, holding one slot until it ends."""
        execution = self.prepare_execution(job)
        thread = threading.Thread(
            target=self._perform, args=(job, queue, execution), name=f"pbe-session-{job.id}", daemon=True
        )
        with self._sessions_lock:
            self._sessions.add(thread)
        thread.start()

    def _perform(self, job: Job, queue: Queue, execution: Any) -> None:
        """The session's thread: hand it the warm pool (``SESSION_POOL``), run the job through RQ's bookkeeping."""
        SESSION_POOL.set(self._pool)
        SESSIONS_IN_FLIGHT.inc()
        try:
            self.perform_job(job, queue, execution)
        except Exception:  # RQ's own bookkeeping failed (Redis away for good): the reconciler takes over
            log.exception("job %s: could not be recorded", job.id)
        finally:
            SESSIONS_IN_FLIGHT.dec()
            with self._sessions_lock:
                self._sessions.discard(threading.current_thread())
                idle = not self._sessions
            self._slots.release()
            if idle:
                self._quietly(lambda: self.set_state(WorkerStatus.IDLE))

    def _running(self) -> int:
        with self._sessions_lock:
            return len(self._sessions)

    def _queues_empty(self) -> bool:
        """No job waits in the queues, nor a retry for its time (``services.queues.RETRIES_KEY``)."""
        return all(queue.count == 0 for queue in self.queues) and not self.connection.zcard(RETRIES_KEY)

    def _drain(self) -> None:
        """Wait for the running sessions to end (a warm stop; the process's stop grace period bounds it)."""
        while True:
            with self._sessions_lock:
                running = list(self._sessions)
            if not running:
                return
            log.info("stopping: waiting for %d running session(s) to end", len(running))
            for thread in running:
                thread.join(timeout=5.0)

    def _shutdown(self) -> None:
        """A stop request: take no more jobs; running sessions end first (``_drain``)."""
        self._stop_requested = True
        self._quietly(self.set_shutdown_requested_date)
        if self._running() == 0:
            raise StopRequested()

    def _release(self, stop: threading.Event) -> None:
        """Queue the retries whose delay is over (``services.queues.release_due_sessions``), every
        ``RELEASE_INTERVAL_S``: a retry waits out its delay here, not in a session slot."""
        while not stop.wait(RELEASE_INTERVAL_S):
            try:
                for job in release_due_sessions(self.connection, time.time()):
                    log.info("task %d of %s: attempt %d queued", job.task_index, job.evaluation_id, job.attempt)
            except RedisError as exc:  # Redis is away: the main loop waits for it
                log.warning("retries not released: %s", exc)

    def _beat(self, stop: threading.Event) -> None:
        while not stop.wait(DEFAULT_HEARTBEAT_INTERVAL_S):
            try:
                if self.connection.exists(self.key):
                    self.heartbeat()
            except RedisError as exc:  # Redis is away: the main loop waits for it
                log.warning("heartbeat skipped: %s", exc)

    @staticmethod
    def _quietly(action: Any) -> None:
        try:
            action()
        except RedisError as exc:
            log.warning("could not tell Redis: %s", exc)


def _sweep(backend: SandboxBackend, worker_id: str) -> None:
    """Remove the sandboxes a previous life of this worker left (it has started none yet); never raises."""
    try:
        swept = backend.reap(worker=worker_id)
    except Exception as exc:  # the backend is away: problem() says so before any job is taken
        log.warning("worker %s: could not look for sandboxes its previous life left: %s", worker_id, exc)
        return
    if swept:
        log.warning("worker %s: removed %d sandbox object(s) its previous life left", worker_id, len(swept))


class _Backoff:
    """Doubling waits from 1 s up to ``DEFAULT_BACKOFF_MAX_S``; ``reset`` after a success."""

    def __init__(self) -> None:
        self._next = 1.0

    def next(self) -> float:
        delay, self._next = self._next, min(DEFAULT_BACKOFF_MAX_S, self._next * 2)
        return delay

    def reset(self) -> None:
        self._next = 1.0
