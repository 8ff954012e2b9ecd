"""Storage limits: what a key's evaluations take in the artifact store (checked against its quota when it
submits), and how long their heavy artifacts are kept (retention, a pass of the gateway's reconciler loop).

What is counted and what is removed are the same bytes: each attempt's ``trajectory.json`` and ``output/``
(``ArtifactStore.artifact_bytes``, ``ArtifactStore.expire``). The records (``evaluation.json``, ``results.json``,
the verdicts) are a few KiB each, are kept for ever, and are not counted.

**Usage is measured on disk, and the measurement cached in Redis.** Not a counter bumped as files are written:
those files are written by executors and graders on other machines through a shared volume, replaced (a session
queued again at the same attempt), removed (by retention, or by an operator); what is on disk is the one figure
every writer agrees with. Walking a folder costs a stat per file, so each evaluation's size is cached per owner:

- an evaluation still running is measured again once its size is ``DEFAULT_OPEN_USAGE_TTL_S`` old;
- a finished one (nothing writes its trajectories or files any more) keeps its size until it is run again (a
  retry raises its attempts, which the cached size is stamped with), retention removes its artifacts (which
  forgets the size), or ``DEFAULT_FINAL_USAGE_TTL_S`` passes (so folders an operator removed by hand stop counting).

A submission thus costs one read of the key's sizes and one small read per evaluation of the key (pipelined), and
walks only the folders of evaluations that changed. The quota is a threshold checked at submission, not a
reservation: an evaluation accepted under it may take the key past it, and the next submission is refused.

**Retention** runs from the reconciler's loop (``gateway.reconcile``), one gateway at a time: each pass looks at
no more than ``DEFAULT_EXAMINED_PER_PASS`` evaluations created before the cut-off, oldest first, from where the
last pass stopped, and removes the artifacts of no more than ``DEFAULT_EXPIRED_PER_PASS`` of them, so a pass never
holds the loop for long, however large the store. An evaluation is due once every task of it is finished and it
finished (wrote its results) more than ``PBE_RETENTION_DAYS`` days ago; one run again after its artifacts were
removed is due again that long after it finishes again. Reads of what was removed raise ``ArtifactExpiredError``
(HTTP 410).

Redis keys (this module is their one writer)::

    pbe:owner:<key id>:usage     hash evaluation id -> its measured size, JSON {size, stamp, final, at}
    pbe:retention:cursor         where the next pass starts: an offset in pbe:evaluations (oldest first)
"""

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta

from redis import Redis
from redis.exceptions import RedisError

from services.state import StateStore, evaluation_key
from services.store import ArtifactStore, Removal

log = logging.getLogger(__name__)

MIB = 1024 * 1024
"""Bytes in a MiB, the unit of ``PBE_STORAGE_QUOTA_MB_PER_KEY``."""

DEFAULT_OPEN_USAGE_TTL_S = 60.0
"""How long the measured size of an evaluation still running counts before its folder is walked again."""

DEFAULT_FINAL_USAGE_TTL_S = 24 * 3600.0
"""How long the measured size of a finished evaluation counts (unless it is run again or expired meanwhile)."""

MAX_EVALUATIONS_COUNTED = 100_000
"""The most evaluations of one key whose sizes a submission adds up (newest first)."""

DEFAULT_EXAMINED_PER_PASS = 100
"""The most evaluations one retention pass looks at."""

DEFAULT_EXPIRED_PER_PASS = 10
"""The most evaluations whose artifacts one retention pass removes."""

CURSOR_KEY = "pbe:retention:cursor"

_ALL_EVALUATIONS = "pbe:evaluations"
"""Every evaluation id by creation time (``services.state``)."""


def usage_key(owner: str) -> str:
    """The hash of ``owner``'s evaluations' measured sizes."""
    return f"pbe:owner:{owner}:usage"


# --- usage ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    """One evaluation's measured size, as cached."""

    size: int
    """Bytes of trajectories and produced files."""
    stamp: int
    """The sum of the evaluation's task attempts when measured: a retry raises it."""
    final: bool
    """Whether the evaluation was finished when measured (nothing wrote its artifacts any more)."""
    at: float
    """When it was measured (seconds since the epoch)."""

    def fresh(self, stamp: int, now: float) -> bool:
        """Whether the size still counts, the evaluation's attempts now summing to ``stamp``."""
        ttl = DEFAULT_FINAL_USAGE_TTL_S if self.final else DEFAULT_OPEN_USAGE_TTL_S
        return self.stamp == stamp and 0 <= now - self.at < ttl

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> "Measured | None":
        """The cached size, or None when the entry does not parse (it is measured again)."""
        try:
            return cls(**json.loads(raw))
        except (ValueError, TypeError):
            return None


def _cached(redis: Redis, owner: str) -> dict[str, Measured]:
    found: dict[str, Measured] = {}
    for key, raw in redis.hgetall(usage_key(owner)).items():
        measured = Measured.from_json(raw)
        if measured is not None:
            found[key.decode() if isinstance(key, bytes) else str(key)] = measured
    return found


def _stamps(redis: Redis, evaluation_ids: list[str]) -> dict[str, int]:
    """Each evaluation's attempts summed (a task without an entry is at attempt 1 and adds nothing), in one
    round trip."""
    pipe = redis.pipeline(transaction=False)
    for evaluation_id in evaluation_ids:
        pipe.hvals(evaluation_key(evaluation_id, "attempts"))
    return {
        evaluation_id: sum(int(value) for value in values)
        for evaluation_id, values in zip(evaluation_ids, pipe.execute(), strict=True)
    }


def _measure(state: StateStore, store: ArtifactStore, evaluation_id: str, stamp: int, now: float) -> Measured:
    """Walk the evaluation's folder. Whether it is finished is read first: a file written after that read
    leaves the size marked not final, so measured again soon."""
    final = state.complete(evaluation_id)
    return Measured(size=store.artifact_bytes(evaluation_id), stamp=stamp, final=final, at=now)


def storage_used(redis: Redis, store: ArtifactStore, owner: str, *, now: float | None = None) -> int:
    """The bytes ``owner``'s evaluations' trajectories and produced files take in the store, from cached sizes
    where they still count and fresh walks of the other folders (see the module's description).

    Raises:
        RedisError: Redis cannot be reached (the gateway answers 503).
        StoreError: an evaluation id in Redis is not a valid one.
    """
    now = time.time() if now is None else now
    state = StateStore(redis)
    evaluation_ids = [evaluation_id for evaluation_id, _ in state.evaluation_ids(owner, limit=MAX_EVALUATIONS_COUNTED)]
    cached, stamps = _cached(redis, owner), _stamps(redis, evaluation_ids)
    measured: dict[str, Measured] = {}
    total = 0
    for evaluation_id in evaluation_ids:
        size = cached.get(evaluation_id)
        if size is None or not size.fresh(stamps[evaluation_id], now):
            size = measured[evaluation_id] = _measure(state, store, evaluation_id, stamps[evaluation_id], now)
        total += size.size
    if measured:
        redis.hset(usage_key(owner), mapping={key: size.to_json() for key, size in measured.items()})
    return total


def forget_usage(redis: Redis, owner: str, evaluation_id: str) -> None:
    """Drop the evaluation's cached size (its artifacts changed): the next submission measures it again."""
    redis.hdel(usage_key(owner), evaluation_id)


# --- retention --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetentionPolicy:
    """How long finished evaluations keep their trajectories and produced files, and a pass's bounds."""

    days: int
    """``PBE_RETENTION_DAYS``; 0 keeps them for ever."""
    examined_per_pass: int = DEFAULT_EXAMINED_PER_PASS
    expired_per_pass: int = DEFAULT_EXPIRED_PER_PASS

    @property
    def setting(self) -> str:
        """The setting and its value, as an expired artifact's error names it."""
        return f"PBE_RETENTION_DAYS={self.days}"


@dataclass
class RetentionReport:
    """What one retention pass did."""

    examined: int = 0
    expired: list[str] = field(default_factory=list)
    """Evaluations whose trajectories and files were removed."""
    freed_bytes: int = 0


def _created_before(redis: Redis, cutoff: datetime, start: int, count: int) -> list[str]:
    """Up to ``count`` evaluations created before ``cutoff``, oldest first, from the ``start``-th on. New
    evaluations enter that range at its end, so an offset into it stays put from one pass to the next."""
    rows = redis.zrangebyscore(_ALL_EVALUATIONS, "-inf", cutoff.timestamp(), start=start, num=count)
    return [row.decode() if isinstance(row, bytes) else str(row) for row in rows]


def _expire_if_due(
    redis: Redis, store: ArtifactStore, evaluation_id: str, policy: RetentionPolicy, now: datetime
) -> Removal:
    """Remove the evaluation's trajectories and files if it finished more than ``policy.days`` ago and has not
    had them removed since.

    Raises:
        StoreError: the store cannot be read or the files removed.
        EvaluationNotFoundError: the evaluation is not in Redis.
    """
    state = StateStore(redis)
    if not state.complete(evaluation_id):
        return Removal(0, 0)
    finished = store.finished_at(evaluation_id)
    if finished is None or finished >= now - timedelta(days=policy.days):
        return Removal(0, 0)
    expiry = store.expiry(evaluation_id)
    if expiry is not None and expiry.expired_at >= finished:
        return Removal(0, 0)  # removed already, and not run again since
    removal = store.expire(
        evaluation_id,
        setting=policy.setting,
        reason=f"it finished on {finished:%Y-%m-%d}, more than {policy.days} days ago",
        now=now,
    )
    if removal.attempts:
        forget_usage(redis, state.get(evaluation_id).owner, evaluation_id)
    return removal


def expire_old(
    redis: Redis, store: ArtifactStore, policy: RetentionPolicy, *, now: datetime | None = None
) -> RetentionReport:
    """One retention pass: remove the trajectories and produced files of evaluations that finished more than
    ``policy.days`` days before ``now``, within the pass's bounds (see the module's description). Nothing when
    ``policy.days`` is 0. An evaluation that cannot be expired (its record half-held, a file that will not go) is
    logged and skipped: the pass goes on, and a later one tries it again.

    Raises:
        RedisError: Redis cannot be reached (the reconciler's loop skips the pass).
    """
    report = RetentionReport()
    if policy.days == 0:
        return report
    now = now or datetime.now(UTC)
    start = int(redis.get(CURSOR_KEY) or 0)
    batch = _created_before(redis, now - timedelta(days=policy.days), start, policy.examined_per_pass)
    for evaluation_id in batch:
        if len(report.expired) >= policy.expired_per_pass:
            break
        report.examined += 1
        try:
            removal = _expire_if_due(redis, store, evaluation_id, policy, now)
        except RedisError:
            raise
        except Exception:  # one broken evaluation must not stop the others, nor the loop
            log.exception("retention: evaluation %s skipped this pass", evaluation_id)
            continue
        if removal.attempts:
            report.expired.append(evaluation_id)
            report.freed_bytes += removal.bytes
    more = report.examined < len(batch) or len(batch) == policy.examined_per_pass
    redis.set(CURSOR_KEY, start + report.examined if more else 0)
    return report
