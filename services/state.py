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
        if api_key:
            pipe.set(f"pbe:secret:model-key:{evaluation.id}", api_key, ex=DEFAULT_SECRET_TTL_S)
        if judge_api_key:
            pipe.set(f"pbe:secret:judge-key:{evaluation.id}", judge_api_key, ex=DEFAULT_SECRET_TTL_S)
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

    def status(self, progress: Progress) -> EvaluationStatus:
        if progress.finished == progress.total:
            return EvaluationStatus.COMPLETED
        if progress.counts[TaskState.QUEUED] + progress.counts[TaskState.UNAVAILABLE] == progress.total:
            return EvaluationStatus.QUEUED
        return EvaluationStatus.RUNNING

    def put_verdict(self, verdict: Verdict) -> None:
        """Record a task's verdict and mark the task done, in one transaction (idempotent per task)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(_key(verdict.evaluation_id, "verdicts"), str(verdict.task_index), verdict.model_dump_json())
        pipe.hset(_key(verdict.evaluation_id, "tasks"), str(verdict.task_index), TaskState.DONE.value)
        pipe.execute()

    def verdicts(self, evaluation_id: str) -> list[Verdict]:
        raw = self.redis.hgetall(_key(evaluation_id, "verdicts"))
        return sorted((Verdict.model_validate_json(v) for v in raw.values()), key=lambda v: v.task_index)
