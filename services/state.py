"""Live state in Redis, read: evaluations, per-task states and verdicts; and the secret store of API keys.

The task states, attempts, verdicts and the cancelled flag are written only by ``services.lifecycle`` (its
transitions); this module reads them, and owns the evaluation records' reads and the secret store.

Keys (all prefixed ``pbe:``)::

    pbe:evaluations                       sorted set of evaluation ids by creation time
    pbe:owner:<key id>:evaluations        the same, per owner (the API key that submitted them)
    pbe:owner:<key id>:open               set of the owner's evaluations not finished yet (its sessions in flight
                                          are counted over these, however old)
    pbe:evaluation:<id>                   the Evaluation as JSON
    pbe:evaluation:<id>:tasks             hash task index -> TaskState
    pbe:evaluation:<id>:attempts          hash task index -> the attempt it is at (absent: 1)
    pbe:evaluation:<id>:verdicts          hash task index -> Verdict JSON (the latest attempt's)
    pbe:evaluation:<id>:cancelled         set when the evaluation was cancelled
    pbe:run:<run id>                      list of the evaluations that are the epochs of a run, in epoch order
    pbe:secret:model-key:<id>             the model API key, kept apart from everything that is logged or
                                          enqueued (job payloads carry only the evaluation id), sealed
                                          (``services.live.secretbox``: never in Redis's files in plain text)
    pbe:secret:judge-key:<id>             the judge's API key, likewise
"""

import logging
import re
from typing import Any

from redis import Redis

from services.errors import PybenchEvalError
from services.evaluation import Evaluation, EvaluationStatus, Progress, TaskState
from services.live.secretbox import SecretBox, SecretsKeyMissingError
from services.verdict import Verdict

DEFAULT_SECRET_TTL_S = 14 * 24 * 3600
"""A model key is forgotten two weeks after its evaluation was submitted."""


class EvaluationNotFoundError(PybenchEvalError):
    pass


EVALUATION_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What an evaluation id may be (the service makes 20 hex digits): never a ``:``, which would address another key."""


def open_key(owner: str) -> str:
    """The set of ``owner``'s evaluations not finished yet (written by ``services.lifecycle``)."""
    return f"pbe:owner:{owner}:open"


def run_key(run_id: str) -> str:
    """The list of a run's epochs (written by ``services.lifecycle``)."""
    return f"pbe:run:{run_id}"


def evaluation_key(evaluation_id: str, *parts: str) -> str:
    """The Redis key of an evaluation (``pbe:evaluation:<id>``) or of one of its parts (``...:<id>:tasks``)."""
    return ":".join(["pbe:evaluation", evaluation_id, *parts])


def _model_key(evaluation_id: str) -> str:
    return f"pbe:secret:model-key:{evaluation_id}"


def _judge_key(evaluation_id: str) -> str:
    return f"pbe:secret:judge-key:{evaluation_id}"


log = logging.getLogger(__name__)


class StateStore:
    """Read the live state of evaluations; hold their API keys, sealed in ``secrets`` (without it, keys can be
    neither held nor read: ``PBE_SECRETS_KEY`` is not set)."""

    def __init__(self, redis: Redis, secrets: SecretBox | None = None) -> None:
        self.redis = redis
        self.secrets = secrets

    def get(self, evaluation_id: str) -> Evaluation:
        """Return an evaluation.

        Raises:
            EvaluationNotFoundError: no evaluation has that id.
        """
        if not EVALUATION_ID.fullmatch(evaluation_id):  # "<id>:tasks" would read another key of the evaluation
            raise EvaluationNotFoundError(
                f"no evaluation {evaluation_id[:80]!r}: ids are letters, digits, - and _; list them with "
                "GET /v1/evaluations"
            )
        raw = self.redis.get(evaluation_key(evaluation_id))
        if raw is None:
            raise EvaluationNotFoundError(f"no evaluation {evaluation_id!r}; list them with GET /v1/evaluations")
        return Evaluation.model_validate_json(raw)

    def set_keys(self, evaluation_id: str, api_key: str | None, judge_api_key: str | None) -> None:
        """Hold the evaluation's model and/or judge key again (after Redis lost them, or they expired), for
        ``DEFAULT_SECRET_TTL_S`` from now. A None key is left as it is.

        Raises:
            SecretsKeyMissingError: a key is given and this store has no secrets key to seal it with.
        """
        pipe = self.redis.pipeline(transaction=True)
        hold_keys(pipe, self.secrets, evaluation_id, api_key, judge_api_key)
        pipe.execute()

    def drop_keys(self, evaluation_id: str) -> None:
        """Forget the evaluation's model and judge keys (it reached a final state; a retry asks for them again)."""
        self.redis.delete(_model_key(evaluation_id), _judge_key(evaluation_id))

    def model_key(self, evaluation_id: str) -> str | None:
        """Return the evaluation's model API key, or None when it has none (or it does not open: lost)."""
        return self._open(_model_key(evaluation_id))

    def judge_key(self, evaluation_id: str) -> str | None:
        """Return the evaluation's judge API key, or None when it has none (or it does not open: lost)."""
        return self._open(_judge_key(evaluation_id))

    def _open(self, name: str) -> str | None:
        """The key held under ``name``, opened; None when none is held or it does not open (logged: the user
        sends it again). Raises nothing."""
        raw = self.redis.get(name)
        if raw is None:
            return None
        sealed = raw if isinstance(raw, bytes) else str(raw).encode()
        secret = self.secrets.open(sealed, name) if self.secrets is not None else None
        if secret is None:
            log.error(
                "%s is held but does not open (PBE_SECRETS_KEY %s): counted as lost",
                name.rsplit(":", 1)[0],
                "is not set" if self.secrets is None else "differs from the one that sealed it",
            )
        return secret

    def task_states(self, evaluation_id: str) -> dict[int, TaskState]:
        raw = self.redis.hgetall(evaluation_key(evaluation_id, "tasks"))
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
        if progress.complete:
            return EvaluationStatus.COMPLETED
        if progress.counts[TaskState.QUEUED] + progress.counts[TaskState.UNAVAILABLE] == progress.total:
            return EvaluationStatus.QUEUED
        return EvaluationStatus.RUNNING

    def complete(self, evaluation_id: str) -> bool:
        """Whether every task of the evaluation is finished (``Progress.complete``): its results are then final."""
        return self.progress(evaluation_id).complete

    def cancelled(self, evaluation_id: str) -> bool:
        return bool(self.redis.exists(evaluation_key(evaluation_id, "cancelled")))

    def task_attempt(self, evaluation_id: str, task_index: int) -> int:
        """The attempt the task is at (1 until it is run again)."""
        raw = self.redis.hget(evaluation_key(evaluation_id, "attempts"), str(task_index))
        return int(raw) if raw else 1

    def task_attempts(self, evaluation_id: str, tasks: list[int]) -> dict[int, int]:
        """``task_attempt`` of each of ``tasks``, in one read."""
        raw = self.redis.hgetall(evaluation_key(evaluation_id, "attempts"))
        attempts = {int(k): int(v) for k, v in raw.items()}
        return {task: attempts.get(task, 1) for task in tasks}

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

    def run_members(self, evaluation: Evaluation) -> list[str]:
        """The evaluations that are the epochs of ``evaluation``'s run, in epoch order (itself alone when it is a
        run of one epoch)."""
        if evaluation.run_id is None:
            return [evaluation.id]
        raw = self.redis.lrange(run_key(evaluation.run_id), 0, -1)
        return [m.decode() if isinstance(m, bytes) else str(m) for m in raw]

    def open_evaluations(self, owner: str) -> list[str]:
        """``owner``'s evaluations not finished yet, however many and however old."""
        return sorted(m.decode() if isinstance(m, bytes) else str(m) for m in self.redis.smembers(open_key(owner)))

    def verdicts(self, evaluation_id: str) -> list[Verdict]:
        raw = self.redis.hgetall(evaluation_key(evaluation_id, "verdicts"))
        return sorted((Verdict.model_validate_json(v) for v in raw.values()), key=lambda v: v.task_index)


def hold_keys(
    pipe: Any, secrets: SecretBox | None, evaluation_id: str, api_key: str | None, judge_api_key: str | None
) -> None:
    """Queue on ``pipe`` the secret-store writes of the keys given, each sealed with ``secrets`` and held for
    ``DEFAULT_SECRET_TTL_S``.

    Raises:
        SecretsKeyMissingError: a key is given and ``secrets`` is None.
    """
    for name, secret in ((_model_key(evaluation_id), api_key), (_judge_key(evaluation_id), judge_api_key)):
        if not secret:
            continue
        if secrets is None:
            raise SecretsKeyMissingError(
                "this service cannot keep API keys: PBE_SECRETS_KEY is not set (make env writes one into .env; "
                "on Kubernetes k8s/secrets.sh puts it in the Secret); submit without keys, or ask the operator"
            )
        pipe.set(name, secrets.seal(secret, name), ex=DEFAULT_SECRET_TTL_S)
