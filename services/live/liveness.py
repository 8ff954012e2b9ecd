"""How a worker shows it is alive: a short heartbeat that dies with it.

RQ keeps a worker's ``rq:worker:<name>`` key for as long as the job it runs may take (an hour for a session), so a
worker killed outright looks alive for that long and the reconciler, which asks that key, waits as long before it
queues the job again. ``ShortHeartbeat`` makes every heartbeat of a worker class short-lived instead: executor and
grader workers refresh it every few seconds, also while a job runs, and one killed outright is dead to the
reconciler within ``DEFAULT_HEARTBEAT_TTL_S``.
"""

from typing import Any

DEFAULT_HEARTBEAT_INTERVAL_S = 5.0
"""How often a worker says it is alive, also while its jobs run."""

DEFAULT_HEARTBEAT_TTL_S = 20
"""A worker that has not said so for this long is dead: its ``rq:worker:<name>`` key expires, and the reconciler
queues its jobs again."""


class ShortHeartbeat:
    """A mixin for an RQ worker class (put it first): every heartbeat lives ``DEFAULT_HEARTBEAT_TTL_S``, whatever
    RQ asks (it asks for the job's timeout when a job starts)."""

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        super().heartbeat(DEFAULT_HEARTBEAT_TTL_S, pipeline)  # type: ignore[misc]
