"""Capacity limits on submissions: sessions in flight per API key, and the queue for everyone."""

from redis import Redis
from rq import Queue

from gateway.problems import Problem
from gateway.settings import GatewaySettings
from services.evaluation import TaskState
from services.queues import SESSIONS_QUEUE
from services.state import StateStore

_IN_FLIGHT = (TaskState.QUEUED, TaskState.RUNNING, TaskState.GRADING)

MAX_EVALUATIONS_SCANNED = 500
"""How many of a key's newest evaluations are counted too (those written before the open set existed)."""


def sessions_in_flight(state: StateStore, owner: str) -> int:
    """Task sessions of ``owner``'s evaluations that are queued, running or being graded: over every evaluation
    of the key not finished yet (``StateStore.open_evaluations``, however old), and its newest ones. The open
    evaluations each hold a session in flight, so the count costs no more than the limit it is checked against."""
    newest = [evaluation_id for evaluation_id, _ in state.evaluation_ids(owner, limit=MAX_EVALUATIONS_SCANNED)]
    total = 0
    for evaluation_id in dict.fromkeys([*state.open_evaluations(owner), *newest]):
        counts = state.progress(evaluation_id).counts
        total += sum(counts[s] for s in _IN_FLIGHT)
    return total


def check_capacity(redis: Redis, state: StateStore, owner: str, new_sessions: int, settings: GatewaySettings) -> None:
    """Refuse a submission of ``new_sessions`` sessions that would pass a limit.

    Raises:
        Problem: 429 past the key's sessions in flight; 503 (with ``Retry-After``) past the global queue.
    """
    in_flight = sessions_in_flight(state, owner)
    if in_flight + new_sessions > settings.MAX_SESSIONS_PER_KEY:
        raise Problem(
            429,
            "Too many sessions in flight",
            f"this key has {in_flight} task sessions queued or running and may have "
            f"{settings.MAX_SESSIONS_PER_KEY}; wait for some to finish, or submit fewer tasks",
            headers={"Retry-After": "60"},
        )
    queued = Queue(SESSIONS_QUEUE, connection=redis).count
    if queued + new_sessions > settings.MAX_QUEUED_SESSIONS:
        raise Problem(
            503,
            "Queue full",
            f"{queued} task sessions are waiting for the executors; retry later",
            headers={"Retry-After": "120"},
        )
