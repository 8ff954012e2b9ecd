"""The task lifecycle: the one module that moves a task of an evaluation between its states.

Every write of a task's state, attempt or live verdict happens here, as a named transition; the gateway, the
reconciler, the executor and the grader call these and nothing else writes them (``services.state`` reads)::

    create ─┬─> queued ──start──> running ──finish_session──> grading ──record_verdict──> done
            │     ^  │               │  │
            │     │  └──cancel──┐    │  └──finish_session (cancelled)──> cancelled
            │     │             v    │
            │     │          cancelled
            │     └── finish_session (a retryable infra end, attempts left): the next attempt, queued again
            │         after the retry delay without holding an executor slot; also POST .../retry (``retry``)
            └─> unavailable (its input files are missing: a verdict at once, never run)

    requeue_session / requeue_grading   the reconciler queues a lost job again, same attempt, at most
                                        MAX_REQUEUES times; then give_up records the attempt's end
    restore                             an evaluation Redis lost, rebuilt from the artifact store

A ``queued`` task is either held (waiting its turn) or admitted (its session job is on the shared queue, or, for a
retry waiting out its delay, in ``services.queues.RETRIES_KEY``): at most
``Evaluation.max_concurrency`` of an evaluation's sessions are admitted or running at once, and each session that
ends admits the next (``services.live.admission``, which only this module calls; ``admit`` fills the window again and
the reconciler calls it every pass).

The retry policy lives here too, applied where a session ends (``finish_session``, called by the executor that ran
it): a session that ends on an infrastructure reason that may mend by itself (a dead sandbox, an endpoint that
timed out or answered 5xx: ``EndReason.retryable``) runs again as its next attempt, up to ``MAX_ATTEMPTS``,
without a grading; a cause only the user can fix (a lost key, a 4xx from the endpoint) is graded ``infra_error``
at once, with a reason that says what to do. The grader only grades.

Keys (prefix ``pbe:evaluation:<id>``, see ``services.state``): ``:tasks`` (index -> state), ``:attempts``
(index -> attempt), ``:verdicts`` (index -> the latest attempt's verdict), ``:cancelled``. An evaluation whose
tasks are all finished has its API keys dropped from the secret store (they are not kept at rest any longer than
a session or the judge needs them), and its manifest's gradings filled in from its verdicts (the grader versions,
the checks hashes, the comparable key: ``services.results.manifest.record_gradings``); ``regrade`` adds a grading's
record.
"""

import logging
import random
import time
from dataclasses import dataclass
from typing import Any

from redis import Redis, WatchError

from services.evaluation import Evaluation, JudgeConfig, TaskState
from services.live.admission import AdmissionWindow
from services.live.secretbox import SecretBox
from services.pybench.suite import Suite
from services.queues import (
    GradeJob,
    SessionJob,
    cancel_job,
    drop_job,
    enqueue_grading,
    enqueue_session,
    grade_job_id,
    schedule_session,
    session_job_id,
    unschedule_session,
)
from services.results.manifest import record_gradings, start_grading
from services.state import StateStore, evaluation_key, hold_keys, open_key, run_key
from services.trajectory import EndReason
from services.verdict import Verdict, VerdictStatus

MAX_ATTEMPTS = 3
"""A session whose ``infra_error`` is retryable runs again, up to this many attempts in all; only the last
attempt's verdict is recorded as the task's (every attempt's is kept in the artifact store)."""


MAX_REQUEUES = 4
"""How often the reconciler queues the same attempt's job again (its worker died, its job crashed or was lost)
before ``give_up`` ends the task with an ``infra_error``: a job that crashes every time it runs (a poison
input) ends with a reason instead of being queued again for ever."""


DEFAULT_RETRY_DELAY_S = 5.0
"""A session's second attempt starts this long (jittered down to half) after it is taken, each later attempt twice
as long, up to a minute: an environment that broke is given time to mend instead of burning the attempts at once."""


log = logging.getLogger(__name__)

GRADINGS_RECORD_TRIES = 20
"""How often completing an evaluation reads and fills in its manifest's gradings when other writers change it."""


def retry_delay_s(attempt: int) -> float:
    """How long the session of ``attempt`` waits before it starts (0 for a first attempt)."""
    if attempt <= 1:
        return 0.0
    return float(min(60.0, DEFAULT_RETRY_DELAY_S * 2.0 ** (attempt - 2)) * random.uniform(0.5, 1.0))


@dataclass(frozen=True)
class Recorded:
    """What ``record_verdict`` did."""

    complete: bool
    """Every task of the evaluation is finished (its results can be written)."""


def unavailable_verdict(evaluation_id: str, suite: Suite, task_index: int) -> Verdict:
    """The verdict of a task whose input files are missing from this copy of the suite (it is never run)."""
    task = suite.tasks.get(task_index)
    missing = ", ".join(task.missing_inputs) if task is not None else "the task is not in this suite"
    return Verdict(
        evaluation_id=evaluation_id,
        task_index=task_index,
        attempt=0,
        paper_category=task.paper_category if task is not None else "",
        status=VerdictStatus.UNAVAILABLE,
        reason="input files missing from this copy of the suite: " + missing,
    )


def session_retryable(end_reason: EndReason, attempt: int) -> bool:
    """The retry policy at a session's end: an infrastructure reason that may mend by itself
    (``EndReason.retryable``), with attempts left."""
    return end_reason.retryable and attempt < MAX_ATTEMPTS


def should_retry(verdict: Verdict) -> bool:
    """The retry policy: an ``infra_error`` that may mend by itself, with attempts left; never for a regrade (which
    starts no session)."""
    return (
        verdict.status is VerdictStatus.INFRA_ERROR
        and verdict.retryable
        and verdict.attempt < MAX_ATTEMPTS
        and verdict.grading == 1
    )


class TaskLifecycle:
    """The transitions of the tasks of evaluations held in ``redis``."""

    def __init__(self, redis: Redis, secrets: SecretBox | None = None) -> None:
        """``secrets`` seals the API keys an evaluation is created with (``services.live.secretbox``)."""
        self.redis = redis
        self.state = StateStore(redis, secrets)
        self.window = AdmissionWindow(redis)

    # --- evaluations ------------------------------------------------------------------------------------------

    def create(
        self, evaluation: Evaluation, suite: Suite, *, api_key: str | None = None, judge_api_key: str | None = None
    ) -> None:
        """Record a new evaluation in one transaction: its runnable tasks ``queued``, its unavailable ones with
        their ``unavailable`` verdicts, its keys in the secret store. Nothing is enqueued (``queue_sessions``).

        Raises:
            SecretsKeyMissingError: a key is given and the lifecycle has no secrets key (nothing is recorded).
        """
        states: dict[Any, Any] = {str(t): TaskState.QUEUED.value for t in evaluation.tasks}
        states.update({str(t): TaskState.UNAVAILABLE.value for t in evaluation.unavailable_tasks})
        unavailable = [unavailable_verdict(evaluation.id, suite, t) for t in evaluation.unavailable_tasks]
        created = evaluation.created_at.timestamp()
        pipe = self.redis.pipeline(transaction=True)
        if unavailable:
            pipe.hset(evaluation_key(evaluation.id, "verdicts"), mapping=_verdict_mapping(unavailable))
        pipe.set(evaluation_key(evaluation.id), evaluation.model_dump_json())
        pipe.hset(evaluation_key(evaluation.id, "tasks"), mapping=states)
        pipe.zadd("pbe:evaluations", {evaluation.id: created})
        pipe.zadd(f"pbe:owner:{evaluation.owner}:evaluations", {evaluation.id: created})
        if set(evaluation.tasks) - set(evaluation.unavailable_tasks):  # open until they have all finished
            pipe.sadd(open_key(evaluation.owner), evaluation.id)
        hold_keys(pipe, self.state.secrets, evaluation.id, api_key, judge_api_key)
        if evaluation.run_id is not None:
            pipe.rpush(run_key(evaluation.run_id), evaluation.id)
        pipe.execute()

    def queue_sessions(self, evaluation: Evaluation) -> list[int]:
        """Put every task still ``queued`` in line, and admit (enqueue the sessions of) as many as the
        evaluation's ``max_concurrency`` allows; the rest are admitted as sessions end. Returns the queued tasks."""
        queued = sorted(i for i, s in self.state.task_states(evaluation.id).items() if s is TaskState.QUEUED)
        self.window.hold(evaluation.id, [i for i in queued if not self.window.is_admitted(evaluation.id, i)])
        self.admit(evaluation.id, evaluation)
        return queued

    def admit(self, evaluation_id: str, evaluation: Evaluation | None = None) -> list[int]:
        """Enqueue the sessions of held tasks while fewer than the evaluation's ``max_concurrency`` are admitted
        (none once it is cancelled). Returns the tasks admitted now.

        Raises:
            EvaluationNotFoundError: the evaluation is not in Redis (and none was given).
        """
        if self.state.cancelled(evaluation_id):
            return []
        limit = (evaluation or self.state.get(evaluation_id)).max_concurrency
        admitted = self.window.admit(evaluation_id, limit)
        for index in admitted:
            enqueue_session(self.redis, self._session(evaluation_id, index))
        return admitted

    def hold_orphans(self, evaluation_id: str) -> list[int]:
        """Put in line the ``queued`` tasks that are neither held nor admitted (an evaluation restored from the
        store, or a crash between two writes), so that ``admit`` reaches them. Returns those tasks."""
        held = set(self.window.held(evaluation_id))
        orphans = [
            i
            for i, s in sorted(self.state.task_states(evaluation_id).items())
            if s is TaskState.QUEUED and i not in held and not self.window.is_admitted(evaluation_id, i)
        ]
        self.window.hold(evaluation_id, orphans)
        return orphans

    def is_held(self, evaluation_id: str, task_index: int) -> bool:
        """Whether a ``queued`` task waits for its turn (no job of it is on the queue, by design)."""
        return task_index in self.window.held(evaluation_id)

    def cancel(self, evaluation_id: str) -> list[int]:
        """Cancel an evaluation: its queued tasks become ``cancelled`` and their jobs are taken off the queue; a
        running session stops before its next turn (``finish_session``); finished sessions are still graded.
        Returns the tasks cancelled here."""
        self.redis.set(evaluation_key(evaluation_id, "cancelled"), "1")
        self.window.release_held(evaluation_id)
        queued = [i for i, s in self.state.task_states(evaluation_id).items() if s is TaskState.QUEUED]
        if queued:
            self._set_states(evaluation_id, dict.fromkeys(queued, TaskState.CANCELLED))
        for index in queued:
            cancel_job(self.redis, session_job_id(self._session(evaluation_id, index)))
            unschedule_session(self.redis, self._session(evaluation_id, index))
        self.window.leave(evaluation_id, queued)
        self._close_if_complete(evaluation_id)
        return queued

    def restore(self, evaluation: Evaluation, suite: Suite, stored: dict[int, Verdict]) -> None:
        """Rebuild in Redis an evaluation it lost, from the artifact store: tasks with a ``stored`` verdict (their
        latest attempt's) come back ``done``, at that attempt; the others ``queued``. A retryable verdict comes
        back ``queued`` at its next attempt (its retry was lost with Redis). The keys were in Redis only: they
        are not restored (sessions then stop with ``key_lost`` until the owner sends them again)."""
        self.create(evaluation, suite)
        for index, verdict in stored.items():
            if index in evaluation.unavailable_tasks:
                continue
            if should_retry(verdict):
                self._set_attempt(evaluation.id, index, verdict.attempt + 1)
            else:
                self._set_attempt(evaluation.id, index, verdict.attempt)
                self._put_verdict(verdict)

    # --- one task ---------------------------------------------------------------------------------------------

    def start(self, job: SessionJob) -> bool:
        """A worker takes the session of ``job``: the task becomes ``running``. Returns False, with the task
        ``cancelled``, when the evaluation was cancelled meanwhile (the session must not run)."""
        if self.state.cancelled(job.evaluation_id):
            self._set_states(job.evaluation_id, {job.task_index: TaskState.CANCELLED})
            self.window.leave(job.evaluation_id, [job.task_index])
            self._close_if_complete(job.evaluation_id)
            return False
        self._set_states(job.evaluation_id, {job.task_index: TaskState.RUNNING})
        return True

    def finish_session(
        self, job: SessionJob, *, cancelled: bool = False, end_reason: EndReason | None = None
    ) -> int | None:
        """The session of ``job`` ended and its trajectory is stored: the task goes to ``grading`` and its
        grading is enqueued; a session stopped by a cancellation goes to ``cancelled`` instead (not graded). Its
        place in the admission window goes to the next held task.

        A session that ended on ``end_reason`` where the retry policy runs it again (``session_retryable``; not once
        the evaluation is cancelled) is not graded: the task goes back to ``queued`` as its next attempt, keeping
        its place in the window, and that attempt's job is scheduled ``retry_delay_s`` from now
        (``services.queues.schedule_session``), so no executor slot waits out the delay. Returns that attempt, or
        None when the session was not run again."""
        if cancelled:
            self._set_states(job.evaluation_id, {job.task_index: TaskState.CANCELLED})
            self.window.leave(job.evaluation_id, [job.task_index])
            self._close_if_complete(job.evaluation_id)
            return None
        if (
            end_reason is not None
            and session_retryable(end_reason, job.attempt)
            and not self.state.cancelled(job.evaluation_id)
        ):
            return self._retry_later(job)
        self._set_states(job.evaluation_id, {job.task_index: TaskState.GRADING})
        self.window.leave(job.evaluation_id, [job.task_index])
        enqueue_grading(
            self.redis, GradeJob(evaluation_id=job.evaluation_id, task_index=job.task_index, attempt=job.attempt)
        )
        self.admit(job.evaluation_id)
        return None

    def _retry_later(self, job: SessionJob) -> int:
        """The task of ``job`` back to ``queued`` as its next attempt, whose job is scheduled after the retry delay
        (in the same transaction). Returns the new attempt."""
        attempt = job.attempt + 1
        pipe = self.redis.pipeline(transaction=True)
        pipe.hdel(evaluation_key(job.evaluation_id, "verdicts"), str(job.task_index))
        pipe.hset(evaluation_key(job.evaluation_id, "tasks"), str(job.task_index), TaskState.QUEUED.value)
        pipe.hset(evaluation_key(job.evaluation_id, "attempts"), str(job.task_index), str(attempt))
        following = SessionJob(evaluation_id=job.evaluation_id, task_index=job.task_index, attempt=attempt)
        schedule_session(pipe, following, time.time() + retry_delay_s(attempt))
        pipe.execute()
        return attempt

    def record_verdict(self, verdict: Verdict) -> Recorded:
        """Record the grade of a session: the task's verdict, the task ``done`` (retries are decided where sessions
        end, ``finish_session``). Idempotent per task and attempt: the grading of an attempt older than the task's
        (a duplicate the reconciler queued) changes nothing."""
        if verdict.attempt < self.state.task_attempt(verdict.evaluation_id, verdict.task_index):
            return Recorded(complete=self.state.complete(verdict.evaluation_id))
        self._put_verdict(verdict)
        return Recorded(complete=self._close_if_complete(verdict.evaluation_id))

    def regrade(self, evaluation: Evaluation, judge: JudgeConfig | None, judge_api_key: str | None) -> list[int]:
        """Grade a finished evaluation again from its stored trajectories and files, starting no session: its
        grading count goes up (and its judge becomes ``judge`` when one is given), every task whose session tested
        the agent goes back to ``grading`` and its grading is enqueued; its manifest lists the new grading. Returns
        those tasks.

        Raises:
            SecretsKeyMissingError: a judge key is given and the lifecycle has no secrets key.
        """
        verdicts = self.state.verdicts(evaluation.id)
        tasks = [v for v in verdicts if v.status not in (VerdictStatus.UNAVAILABLE, VerdictStatus.INFRA_ERROR)]
        update: dict[str, Any] = {"grading": evaluation.grading + 1}
        if judge is not None:
            update |= {"judge": judge, "has_judge_api_key": judge_api_key is not None}
        if evaluation.manifest is not None:
            update["manifest"] = start_grading(evaluation.manifest, evaluation.grading + 1, judge or evaluation.judge)
        regraded = evaluation.model_copy(update=update)
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(evaluation_key(evaluation.id), regraded.model_dump_json())
        if tasks:
            pipe.hset(
                evaluation_key(evaluation.id, "tasks"),
                mapping={str(v.task_index): TaskState.GRADING.value for v in tasks},
            )
            pipe.sadd(open_key(evaluation.owner), evaluation.id)
        hold_keys(pipe, self.state.secrets, evaluation.id, None, judge_api_key)
        pipe.execute()
        for verdict in tasks:
            job = GradeJob(
                evaluation_id=evaluation.id,
                task_index=verdict.task_index,
                attempt=verdict.attempt,
                grading=regraded.grading,
            )
            enqueue_grading(self.redis, job)
        return [v.task_index for v in tasks]

    def retry(self, evaluation_id: str, task_index: int) -> int:
        """Run a task again as its next attempt: its verdict dropped, its state ``queued``, held at the front of
        the line (its session is enqueued as soon as the window has room). Returns the new attempt."""
        attempt = self.state.task_attempt(evaluation_id, task_index) + 1
        owner = self.state.get(evaluation_id).owner
        pipe = self.redis.pipeline(transaction=True)
        pipe.sadd(open_key(owner), evaluation_id)  # open again until its retried tasks finish
        pipe.hdel(evaluation_key(evaluation_id, "verdicts"), str(task_index))
        pipe.hset(evaluation_key(evaluation_id, "tasks"), str(task_index), TaskState.QUEUED.value)
        pipe.hset(evaluation_key(evaluation_id, "attempts"), str(task_index), str(attempt))
        pipe.execute()
        self.window.leave(evaluation_id, [task_index])  # its earlier attempt's session is over
        self.window.hold(evaluation_id, [task_index], front=True)
        self.admit(evaluation_id)
        return attempt

    def count_requeue(self, evaluation_id: str, task_index: int, attempt: int) -> int:
        """Count one more time the reconciler found the job of this attempt lost; returns the count so far
        (``MAX_REQUEUES`` bounds it: past it the reconciler calls ``give_up``)."""
        return int(self.redis.hincrby(evaluation_key(evaluation_id, "requeues"), f"{task_index}:{attempt}", 1))

    def requeues(self, evaluation_id: str, task_index: int, attempt: int) -> int:
        """How often the job of this attempt was found lost so far."""
        raw = self.redis.hget(evaluation_key(evaluation_id, "requeues"), f"{task_index}:{attempt}")
        return int(raw) if raw else 0

    def give_up(self, verdict: Verdict) -> Recorded:
        """End a task whose attempt's job was lost or crashed more than ``MAX_REQUEUES`` times: ``verdict`` (an
        ``infra_error`` that says so, not retryable) is recorded as the task's, its place in the admission window
        goes to the next held task."""
        self._put_verdict(verdict)
        self.window.leave(verdict.evaluation_id, [verdict.task_index])
        complete = self._close_if_complete(verdict.evaluation_id)
        self.admit(verdict.evaluation_id)
        return Recorded(complete=complete)

    def requeue_session(self, job: SessionJob) -> None:
        """Queue again, at the same attempt, a session whose job was lost (its worker died, Redis dropped it); it
        keeps (or takes) its place in the admission window."""
        self._set_states(job.evaluation_id, {job.task_index: TaskState.QUEUED})
        self.window.enter(job.evaluation_id, job.task_index)
        drop_job(self.redis, session_job_id(job))
        enqueue_session(self.redis, job)

    def requeue_grading(self, job: GradeJob) -> None:
        """Queue again a grading whose job was lost (the task stays ``grading``)."""
        drop_job(self.redis, grade_job_id(job))
        enqueue_grading(self.redis, job)

    def _close_if_complete(self, evaluation_id: str) -> bool:
        """When every task is finished, forget the evaluation's API keys (no session or judge needs them any
        more; a later retry stops with ``key_lost`` until they are sent again), and fill in its manifest's gradings.
        Returns whether it was complete."""
        complete = self.state.complete(evaluation_id)
        if complete:
            self._record_gradings(evaluation_id)
            self.state.drop_keys(evaluation_id)
            self.window.forget(evaluation_id)
            self.redis.srem(open_key(self.state.get(evaluation_id).owner), evaluation_id)
        return complete

    # --- the writes ---------------------------------------------------------------------------------------------

    def _session(self, evaluation_id: str, task_index: int) -> SessionJob:
        return SessionJob(
            evaluation_id=evaluation_id,
            task_index=task_index,
            attempt=self.state.task_attempt(evaluation_id, task_index),
        )

    def _set_states(self, evaluation_id: str, states: dict[int, TaskState]) -> None:
        self.redis.hset(
            evaluation_key(evaluation_id, "tasks"),
            mapping={str(i): s.value for i, s in states.items()},
        )

    def _set_attempt(self, evaluation_id: str, task_index: int, attempt: int) -> None:
        self.redis.hset(evaluation_key(evaluation_id, "attempts"), str(task_index), str(attempt))

    def _record_gradings(self, evaluation_id: str) -> None:
        """Fill in the gradings of the evaluation's manifest from its verdicts (``record_gradings``), written only if
        neither the evaluation nor its verdicts changed meanwhile (else read and filled again). Nothing without a
        manifest. Tries ``GRADINGS_RECORD_TRIES`` times against concurrent writers, then leaves the record as it was
        (logged; the next completion of a grading fills it in)."""
        key = evaluation_key(evaluation_id)
        with self.redis.pipeline(transaction=True) as pipe:
            for _ in range(GRADINGS_RECORD_TRIES):
                try:
                    pipe.watch(key, evaluation_key(evaluation_id, "verdicts"))  # type: ignore[no-untyped-call]
                    raw = pipe.get(key)
                    if raw is None:
                        return
                    evaluation = Evaluation.model_validate_json(raw)
                    if evaluation.manifest is None:
                        return
                    manifest = record_gradings(
                        evaluation.manifest, evaluation.grading, self.state.verdicts(evaluation_id)
                    )
                    if manifest == evaluation.manifest:
                        return
                    pipe.multi()
                    pipe.set(key, evaluation.model_copy(update={"manifest": manifest}).model_dump_json())
                    pipe.execute()
                    return
                except WatchError:
                    continue
        log.warning("%s: its manifest's gradings changed under %d tries; left as they were", evaluation_id,
                    GRADINGS_RECORD_TRIES)  # fmt: skip

    def _put_verdict(self, verdict: Verdict) -> None:
        """The task's verdict and its state ``done``, in one transaction."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(evaluation_key(verdict.evaluation_id, "verdicts"), str(verdict.task_index), verdict.model_dump_json())
        pipe.hset(evaluation_key(verdict.evaluation_id, "tasks"), str(verdict.task_index), TaskState.DONE.value)
        pipe.execute()


def _verdict_mapping(verdicts: list[Verdict]) -> dict[Any, Any]:
    return {str(v.task_index): v.model_dump_json() for v in verdicts}
