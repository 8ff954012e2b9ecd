"""Live progress for the dashboard's pages, as server-sent events.

The streams are asynchronous: between two looks at Redis a stream only sleeps on the event loop, and each look runs
briefly in a worker thread. An open page therefore never holds one of the server's worker threads (the synchronous
routes of the gateway, the REST API's included, share them), however many pages are open. A runs list follows all
its running evaluations in one stream, so a browser keeps one connection per page (browsers open six at most to a
host). Events::

    progress   {"evaluation_id", "status", "total", "counts", "complete"}   when an evaluation's progress changes
    verdict    the verdict of a task, once per task, attempt and status       (an evaluation's stream only)
    end        {"statuses": {evaluation id: status}}                         once everything followed is finished
"""

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio

from services.state import StateStore
from services.verdict import Verdict

DEFAULT_POLL_S = 0.5
"""How often Redis is read for changes."""

DEFAULT_HEARTBEAT_S = 15.0
"""A comment line this often keeps proxies from closing a quiet stream."""

DEFAULT_MAX_STREAM_S = 3600.0
"""A stream ends after this long even if its evaluations have not (the browser's EventSource reconnects)."""

MAX_FOLLOWED = 50
"""Evaluations one runs-list stream follows at most."""


@dataclass
class _Look:
    """What one poll saw of the evaluations followed."""

    progress: dict[str, str] = field(default_factory=dict)
    """Each evaluation's progress event data (JSON text)."""
    complete: dict[str, bool] = field(default_factory=dict)
    status: dict[str, str] = field(default_factory=dict)
    verdicts: list[Verdict] = field(default_factory=list)


def _look(state: StateStore, evaluation_ids: list[str], with_verdicts: bool) -> _Look:
    look = _Look()
    for evaluation_id in evaluation_ids:
        progress = state.progress(evaluation_id)
        status = state.status(progress, evaluation_id).value
        data = {"evaluation_id": evaluation_id, "status": status, **progress.model_dump(mode="json")}
        look.progress[evaluation_id] = json.dumps(data, sort_keys=True)
        look.complete[evaluation_id] = progress.complete
        look.status[evaluation_id] = status
        if with_verdicts:
            look.verdicts.extend(state.verdicts(evaluation_id))
    return look


def _event(name: str, data: str) -> str:
    return f"event: {name}\ndata: {data}\n\n"


async def follow(
    state: StateStore,
    evaluation_ids: list[str],
    *,
    verdicts: bool,
    poll_s: float = DEFAULT_POLL_S,
    heartbeat_s: float = DEFAULT_HEARTBEAT_S,
    max_stream_s: float = DEFAULT_MAX_STREAM_S,
) -> AsyncIterator[str]:
    """Server-sent events of ``evaluation_ids`` (their access already checked): ``progress`` on each change,
    ``verdict`` per task graded when ``verdicts``, and ``end`` once all are finished. Ends after ``max_stream_s``.

    Raises:
        redis.RedisError: Redis cannot be read (the stream stops; the browser reconnects later).
    """
    sent_progress: dict[str, str] = {}
    sent_verdicts: set[tuple[int, int, str]] = set()
    began = last_beat = time.monotonic()
    while time.monotonic() - began < max_stream_s:
        look = await anyio.to_thread.run_sync(_look, state, evaluation_ids, verdicts)
        for evaluation_id, data in look.progress.items():
            if sent_progress.get(evaluation_id) != data:
                sent_progress[evaluation_id] = data
                yield _event("progress", data)
        for verdict in look.verdicts:
            key = (verdict.task_index, verdict.attempt, verdict.status.value)
            if key not in sent_verdicts:
                sent_verdicts.add(key)
                yield _event("verdict", verdict.model_dump_json())
        if all(look.complete.values()):
            yield _event("end", json.dumps({"statuses": look.status}, sort_keys=True))
            return
        if time.monotonic() - last_beat > heartbeat_s:
            last_beat = time.monotonic()
            yield ": still running\n\n"
        await anyio.sleep(poll_s)
