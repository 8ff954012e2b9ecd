"""The executor's RQ worker: many task sessions at once in one process, beside a warm pool of sandboxes.

A session spends its time waiting on the model and on the kernel, so one process runs many:
``ExecutorWorker`` runs RQ's own work loop (``Worker.work``) and overrides its hooks: the dequeue waits for one of
its ``PBE_SESSIONS_PER_WORKER`` slots to be free, and ``execute_job`` runs the job in a thread of its own (RQ's own
job bookkeeping, one execution record per job; timeouts by timer, as signals reach only the main thread). It owns
the process's ``WarmPool`` (``PBE_WARM_POOL_SIZE`` sandboxes kept ready), filled when the worker starts and emptied
when it stops, and hands it to each session's thread (``executor.pool.SESSION_POOL``, a context variable the job
reads): no module holds it.

What keeps it honest when things break:

- **Its death is seen fast.** A thread beats the worker's heartbeat every ``DEFAULT_HEARTBEAT_INTERVAL_S`` with
  a short time to live (``services.live.liveness``), so a worker killed mid-session is dead (its ``rq:worker:<name>``
  key gone) within ``DEFAULT_HEARTBEAT_TTL_S`` and the gateway's reconciler queues its sessions again.
- **It rides out a Redis outage.** Its connection retries every command for about a minute
  (``services.settings.redis_retry``). RQ's loop quits on any exception from its steps (the suspension check,
  maintenance, the dequeue, the heartbeat), so each of those hooks waits for Redis instead of raising: the
  sessions in flight go on.
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
from types import FrameType
from typing import Any

from redis.exceptions import RedisError
from rq.defaults import DEFAULT_LOGGING_DATE_FORMAT, DEFAULT_LOGGING_FORMAT
from rq.exceptions import DequeueTimeout, StopRequested
from rq.job import Job
from rq.queue import Queue
from rq.timeouts import TimerDeathPenalty
from rq.worker import DequeueStrategy, SimpleWorker, WorkerStatus

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
    """An RQ worker that runs up to ``PBE_SESSIONS_PER_WORKER`` jobs at once in threads of its own, in RQ's own work
    loop (see the module's description)."""

    death_penalty_class = TimerDeathPenalty

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sessions: set[threading.Thread] = set()
        self._sessions_lock = threading.Lock()
        self._backoff = _Backoff()
        self._burst = False
        self._cold_stop = False

    def work(
        self,
        burst: bool = False,
        logging_level: str | None = "INFO",
        date_format: str = DEFAULT_LOGGING_DATE_FORMAT,
        log_format: str = DEFAULT_LOGGING_FORMAT,
        max_jobs: int | None = None,
        max_idle_time: int | None = None,
        with_scheduler: bool = False,
        dequeue_strategy: DequeueStrategy = DequeueStrategy.DEFAULT,
    ) -> bool:
        """Make the session slots, the backend, the metrics and the warm pool, then take and run jobs in RQ's own
        loop (``Worker.work``, with the hooks below) until stopped or, in ``burst`` mode, until the queue is empty
        and every session has ended. Returns whether any job was taken.

        Raises:
            ValueError: ``max_idle_time`` is given (a worker with sessions running is never idle: stop it instead).
        """
        if max_idle_time is not None:
            raise ValueError("the executor's worker takes no --max-idle-time: stop it with SIGTERM instead")
        settings = ExecutorSettings()
        self.connection.set_retry(redis_retry())
        self._slots = threading.BoundedSemaphore(settings.SESSIONS_PER_WORKER)
        self._burst = burst
        self._backend = get_backend(settings)
        _sweep(self._backend, settings.WORKER_ID)
        configure_logging(level=logging_level or "INFO")  # first: RQ's own lines then take its format too
        serve_worker_metrics(settings.METRICS_PORT, metrics_address(settings.METRICS_HOST, settings.REDIS_URL))
        self._quietly(
            lambda: advertise(self.connection, {SANDBOX_IMAGE: self._backend.image_reference(settings.SANDBOX_IMAGE)})
        )
        self._pool = open_pool(settings, self._backend)
        stop = threading.Event()
        threading.Thread(target=self._beat, args=(stop,), name="pbe-heartbeat", daemon=True).start()
        threading.Thread(target=self._release, args=(stop,), name="pbe-retries", daemon=True).start()
        try:
            return bool(
                super().work(
                    burst,
                    logging_level,
                    date_format,
                    log_format,
                    max_jobs=max_jobs,
                    with_scheduler=with_scheduler,
                    dequeue_strategy=dequeue_strategy,
                )
            )
        finally:
            stop.set()
            if self._pool is not None:
                self._pool.close()

    # RQ's loop, step by step: check_for_suspension, run_maintenance_tasks, dequeue_job_and_maintain_ttl,
    # execute_job, heartbeat; teardown when it ends. RQ ends the loop on any exception from them, so each hook
    # below waits Redis out instead of raising.

    def check_for_suspension(self, burst: bool) -> None:
        """RQ's check (``rq suspend``: while suspended, it waits here); Redis away waits for Redis, backing off, and
        checks again, instead of ending the loop."""
        while True:
            try:
                super().check_for_suspension(burst)
                return
            except RedisError as exc:
                self._wait_for_redis(exc)

    def run_maintenance_tasks(self) -> None:
        """RQ's registry cleaning; Redis away skips it (it runs again at the next turn of the loop)."""
        try:
            super().run_maintenance_tasks()  # type: ignore[no-untyped-call]
        except RedisError as exc:
            log.warning("RQ's maintenance skipped: %s", exc)

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        """Wait for a free slot and a sandbox backend that can start sandboxes, then take a job (RQ's own dequeue,
        ``DEFAULT_DEQUEUE_WAIT_S`` at a time, so a stop request or a changed backend is seen soon; ``timeout`` and
        ``max_idle_time`` are not used). The slot taken is held for the job (``execute_job``'s thread frees it).

        Returns:
            The job and its queue; None in ``burst`` mode once no job waits and no session runs.

        Raises:
            StopRequested: a stop was asked for.
        """
        while True:
            if self._stop_requested:
                raise StopRequested()
            if not self._slots.acquire(timeout=1.0):
                continue
            result = None
            try:
                result = self._take_job()
            finally:
                if result is None:
                    self._slots.release()
            if result is not None:
                return result
            if self._burst and self._idle():
                return None

    def _take_job(self) -> tuple[Job, Queue] | None:
        """One try (a free slot held): the backend's problem waits a backoff step, as does Redis away."""
        problem = self._backend.problem()
        if problem is not None:
            delay = self._backoff.next()
            log.error("not taking sessions: %s (checking again in %.0f s)", problem, delay)
            time.sleep(delay)
            return None
        wait = None if self._burst else DEFAULT_DEQUEUE_WAIT_S
        try:
            result = super().dequeue_job_and_maintain_ttl(wait, max_idle_time=wait)
        except (RedisError, DequeueTimeout) as exc:
            self._wait_for_redis(exc)
            return None
        self._backoff.reset()
        return result

    def _idle(self) -> bool:
        """Burst mode's end: no session runs and no job waits, nor a retry for its time
        (``services.queues.RETRIES_KEY``); sessions still running may admit more work, so it waits a little."""
        try:
            waiting = any(queue.count for queue in self.queues) or self.connection.zcard(RETRIES_KEY)
            if self._running() == 0 and not waiting:
                return True
        except RedisError as exc:
            self._wait_for_redis(exc)
            return False
        time.sleep(0.2)
        return False

    def execute_job(self, job: Job, queue: Queue) -> None:
        """Start ``job`` in a thread of its own, holding the slot the dequeue took until it ends; returns at once.
        Redis away before the job's start is recorded leaves it to the gateway's reconciler, which queues it
        again."""
        try:
            execution = self.prepare_execution(job)
        except RedisError as exc:
            self._slots.release()
            log.error("job %s: not started, Redis is away (%s); the reconciler queues it again", job.id, exc)
            self._wait_for_redis(exc)
            return
        thread = threading.Thread(
            target=self._perform, args=(job, queue, execution), name=f"pbe-session-{job.id}", daemon=True
        )
        with self._sessions_lock:
            self._sessions.add(thread)
        thread.start()

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        """``ShortHeartbeat``'s; Redis away skips a beat (the heartbeat thread beats again within
        ``DEFAULT_HEARTBEAT_INTERVAL_S``) instead of ending RQ's loop. A pipeline's beat is its caller's to send."""
        if pipeline is not None:
            super().heartbeat(timeout, pipeline)
            return
        try:
            super().heartbeat(timeout)
        except RedisError as exc:
            log.warning("heartbeat skipped: %s", exc)

    def teardown(self) -> None:
        """Wait for the running sessions to end (a warm stop: the process's stop grace period bounds it; not after
        a second signal), then RQ's own (the worker's death recorded; skipped when Redis is away)."""
        try:
            if not self._cold_stop:
                self._drain()
        finally:
            self._quietly(super().teardown)

    def request_force_stop(self, signum: int, frame: FrameType | None) -> None:
        """RQ's cold stop (a second signal): no more waiting for the running sessions."""
        try:
            super().request_force_stop(signum, frame)
        except SystemExit:
            self._cold_stop = True
            raise

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

    def _drain(self) -> None:
        """Wait for the running sessions to end."""
        while True:
            with self._sessions_lock:
                running = list(self._sessions)
            if not running:
                return
            log.info("stopping: waiting for %d running session(s) to end", len(running))
            for thread in running:
                thread.join(timeout=5.0)

    def _shutdown(self) -> None:
        """A stop request: take no more jobs; running sessions end first (``teardown``)."""
        self._stop_requested = True
        self._quietly(self.set_shutdown_requested_date)
        if self._running() == 0:
            raise StopRequested()

    def _wait_for_redis(self, exc: Exception) -> None:
        """Redis did not answer (``exc``, after its connection's own retries): wait one backoff step."""
        delay = self._backoff.next()
        log.warning("Redis is away (%s); waiting %.0f s for it", exc, delay)
        time.sleep(delay)

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
