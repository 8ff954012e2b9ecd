"""Live state in Redis: evaluations, per-task states, verdicts, and the model-key secret store.

Keys (all prefixed ``pbe:``)::

    pbe:evaluations                       sorted set of evaluation ids by creation time
    pbe:evaluation:<id>                   the Evaluation as JSON
    pbe:evaluation:<id>:tasks             hash task index -> TaskState
    pbe:evaluation:<id>:verdicts          hash task index -> Verdict JSON (the latest attempt's)
    pbe:secret:model-key:<id>             the model API key, kept apart from everything that is logged
    pbe:secret:judge-key:<id>             the judge's API key, likewise
                                          or enqueued; job payloads carry only the evaluation id
"""

from typing import Any

from redis import Redis

from services.errors import PybenchEvalError
from services.evaluation import Evaluation, EvaluationStatus, Progress, TaskState
from services.verdict import Verdict

DEFAULT_SECRET_TTL_S = 14 * 24 * 3600
"""A model key is forgotten two weeks after its evaluation was submitted."""


class EvaluationNotFoundError(PybenchEvalError):
    pass


def _verdict_mapping(verdicts: list[Verdict]) -> dict[Any, Any]:
    return {str(v.task_index): v.model_dump_json() for v in verdicts}


def _key(evaluation_id: str, *parts: str) -> str:
    return ":".join(["pbe:evaluation", evaluation_id, *parts])


class StateStore:
    """Read and write the live state of evaluations."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    def create(
        self,
        evaluation: Evaluation,
        api_key: str | None,
        unavailable: list[Verdict] | None = None,
        judge_api_key: str | None = None,
    ) -> None:
        """Record a new evaluation in one transaction: every task queued, and the unavailable tasks with
        their ``unavailable`` verdicts (they are never run). The keys go to the secret store only."""
        states: dict[Any, Any] = {str(t): TaskState.QUEUED.value for t in evaluation.tasks}
        states.update({str(t): TaskState.UNAVAILABLE.value for t in evaluation.unavailable_tasks})
        pipe = self.redis.pipeline(transaction=True)
        if unavailable:
            pipe.hset(_key(evaluation.id, "verdicts"), mapping=_verdict_mapping(unavailable))
        pipe.set(_key(evaluation.id), evaluation.model_dump_json())
        pipe.hset(_key(evaluation.id, "tasks"), mapping=states)
        pipe.zadd("pbe:evaluations", {evaluation.id: evaluation.created_at.timestamp()})
        pipe.zadd(f"pbe:owner:{evaluation.owner}:evaluations", {evaluation.id: evaluation.created_at.timestamp()})
        _hold_keys(pipe, evaluation.id, api_key, judge_api_key)
        pipe.execute()

    def get(self, evaluation_id: str) -> Evaluation:
        """Return an evaluation.

        Raises:
            EvaluationNotFoundError: no evaluation has that id.
        """
        raw = self.redis.get(_key(evaluation_id))
        if raw is None:
            raise EvaluationNotFoundError(f"no evaluation {evaluation_id!r}; list them with GET /v1/evaluations")
        return Evaluation.model_validate_json(raw)

    def set_keys(self, evaluation_id: str, api_key: str | None, judge_api_key: str | None) -> None:
        """Hold the evaluation's model and/or judge key again (after Redis lost them, or they expired), for
        ``DEFAULT_SECRET_TTL_S`` from now. A None key is left as it is."""
        pipe = self.redis.pipeline(transaction=True)
        _hold_keys(pipe, evaluation_id, api_key, judge_api_key)
        pipe.execute()

    def model_key(self, evaluation_id: str) -> str | None:
        """Return the evaluation's model API key, or None when it has none."""
        raw = self.redis.get(f"pbe:secret:model-key:{evaluation_id}")
        return raw.decode() if isinstance(raw, bytes) else raw

    def judge_key(self, evaluation_id: str) -> str | None:
        """Return the evaluation's judge API key, or None when it has none."""
        raw = self.redis.get(f"pbe:secret:judge-key:{evaluation_id}")
        return raw.decode() if isinstance(raw, bytes) else raw

    def set_task_state(self, evaluation_id: str, task_index: int, state: TaskState) -> None:
        self.redis.hset(_key(evaluation_id, "tasks"), str(task_index), state.value)

    def task_states(self, evaluation_id: str) -> dict[int, TaskState]:
        raw = self.redis.hgetall(_key(evaluation_id, "tasks"))
        return {int(k): TaskState(v.decode() if isinstance(v, bytes) else v) for k, v in raw.items()}

    def progress(self, evaluation_id: str) -> Progress:
        states = self.task_states(evaluation_id)
        counts = {state: 0 for state in TaskState}
        for state in states.values():
            counts[state] += 1
        return Progress(total=len(states), counts=counts)

    def status(self, progress: Progress, evaluation_id: str | None = None) -> EvaluationStatus:
        """Where the evaluation stands, given its progress (and its id, to tell a cancelled one)."""
        if evaluation_id is not None and self.cancelled(evaluation_id):
            return EvaluationStatus.CANCELLED
        if progress.finished == progress.total:
            return EvaluationStatus.COMPLETED
        if progress.counts[TaskState.QUEUED] + progress.counts[TaskState.UNAVAILABLE] == progress.total:
            return EvaluationStatus.QUEUED
        return EvaluationStatus.RUNNING

    def cancel(self, evaluation_id: str) -> list[int]:
        """Mark the evaluation cancelled and its queued tasks ``cancelled``; returns those tasks.

        Executors skip a cancelled evaluation's queued jobs; a running session stops before its next turn and
        its task becomes ``cancelled`` (not graded). Sessions that already finished are graded.
        """
        self.redis.set(_key(evaluation_id, "cancelled"), "1")
        queued = [index for index, state in self.task_states(evaluation_id).items() if state is TaskState.QUEUED]
        if queued:
            self.redis.hset(_key(evaluation_id, "tasks"), mapping={str(i): TaskState.CANCELLED.value for i in queued})
        return queued

    def cancelled(self, evaluation_id: str) -> bool:
        return bool(self.redis.exists(_key(evaluation_id, "cancelled")))

    def task_attempt(self, evaluation_id: str, task_index: int) -> int:
        """The attempt the task is at (1 until it is run again)."""
        raw = self.redis.hget(_key(evaluation_id, "attempts"), str(task_index))
        return int(raw) if raw else 1

    def set_task_attempt(self, evaluation_id: str, task_index: int, attempt: int) -> None:
        self.redis.hset(_key(evaluation_id, "attempts"), str(task_index), str(attempt))

    def reopen_task(self, evaluation_id: str, task_index: int, attempt: int) -> None:
        """Queue a task again as ``attempt``: its verdict is dropped, its state ``queued``."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hdel(_key(evaluation_id, "verdicts"), str(task_index))
        pipe.hset(_key(evaluation_id, "tasks"), str(task_index), TaskState.QUEUED.value)
        pipe.hset(_key(evaluation_id, "attempts"), str(task_index), str(attempt))
        pipe.execute()

    def evaluation_ids(self, owner: str | None, *, limit: int, before: float | None = None) -> list[tuple[str, float]]:
        """Evaluation ids with their creation times, newest first, older than ``before`` (a timestamp);
        ``owner`` None for every owner's."""
        index = "pbe:evaluations" if owner is None else f"pbe:owner:{owner}:evaluations"
        high = f"({before}" if before is not None else "+inf"
        rows = self.redis.zrevrangebyscore(index, high, "-inf", start=0, num=limit, withscores=True)
        found: list[tuple[str, float]] = []
        for row in rows:
            member, score = row[0], row[1]
            found.append((member.decode() if isinstance(member, bytes) else str(member), float(score)))
        return found

    def put_verdict(self, verdict: Verdict) -> None:
        """Record a task's verdict and mark the task done, in one transaction (idempotent per task)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(_key(verdict.evaluation_id, "verdicts"), str(verdict.task_index), verdict.model_dump_json())
        pipe.hset(_key(verdict.evaluation_id, "tasks"), str(verdict.task_index), TaskState.DONE.value)
        pipe.execute()

    def verdicts(self, evaluation_id: str) -> list[Verdict]:
        raw = self.redis.hgetall(_key(evaluation_id, "verdicts"))
        return sorted((Verdict.model_validate_json(v) for v in raw.values()), key=lambda v: v.task_index)


def _hold_keys(pipe: Any, evaluation_id: str, api_key: str | None, judge_api_key: str | None) -> None:
    """Queue on ``pipe`` the secret-store writes of the keys given (each for ``DEFAULT_SECRET_TTL_S``)."""
    if api_key:
        pipe.set(f"pbe:secret:model-key:{evaluation_id}", api_key, ex=DEFAULT_SECRET_TTL_S)
    if judge_api_key:
        pipe.set(f"pbe:secret:judge-key:{evaluation_id}", judge_api_key, ex=DEFAULT_SECRET_TTL_S)
