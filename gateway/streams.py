"""Live progress as server-sent events, for the REST API (``GET /v1/evaluations/{id}/events``) and the
dashboard's pages alike, and the limit on how many such streams are open.

The streams are asynchronous: between two looks at Redis (``gateway.readmodel.look``) a stream only sleeps on the
event loop, and each look runs briefly in a worker thread. An open stream therefore never holds one of the server's
worker threads (the synchronous routes of the gateway share them), however many are open. A runs list follows all
its running evaluations in one stream, so a browser keeps one connection per page (browsers open six at most to a
host). Events::

    progress   {"evaluation_id", "status", "total", "counts", "complete"}   when an evaluation's progress changes
    verdict    the verdict of a task, once per task, attempt and status       (when verdicts are followed)
    end        {"statuses": {evaluation id: status}, "status": ...}          once everything followed is finished
               ("status": the one evaluation's, when one is followed)

``OpenStreams`` counts the streams open in this process, per API key and in all; past either limit
(``PBE_MAX_STREAMS_PER_KEY``, ``PBE_MAX_STREAMS``) a new stream is refused with 429 and ``Retry-After``.
"""

import json
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from functools import partial

import anyio
from fastapi.responses import StreamingResponse

from gateway import readmodel
from gateway.problems import Problem
from services.state import StateStore

DEFAULT_POLL_S = 0.5
"""How often Redis is read for changes."""

DEFAULT_HEARTBEAT_S = 15.0
"""A comment line this often keeps proxies from closing a quiet stream."""

DEFAULT_MAX_STREAM_S = 3600.0
"""A stream ends after this long even if its evaluations have not (the browser's EventSource reconnects)."""

MAX_FOLLOWED = 50
"""Evaluations one runs-list stream follows at most."""


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
        look = await anyio.to_thread.run_sync(partial(readmodel.look, state, evaluation_ids, with_verdicts=verdicts))
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
            end: dict[str, object] = {"statuses": look.status}
            if len(look.status) == 1:
                end["status"] = next(iter(look.status.values()))
            yield _event("end", json.dumps(end, sort_keys=True))
            return
        if time.monotonic() - last_beat > heartbeat_s:
            last_beat = time.monotonic()
            yield ": still running\n\n"
        await anyio.sleep(poll_s)


STREAM_RETRY_AFTER_S = 30
"""What a refused stream's ``Retry-After`` asks a client to wait."""


class OpenStreams:
    """How many event streams are open in this process, per API key and in all; thread-safe.

    ``open`` counts a new stream or refuses it; the stream's generator is wrapped so that its end, however it
    comes (finished, the client gone, the server stopping), counts it out again.
    """

    def __init__(self, per_key: int, total: int) -> None:
        self.per_key, self.total = per_key, total
        self._open: Counter[str] = Counter()
        self._lock = threading.Lock()

    def open(self, key_id: str, events: AsyncIterator[str]) -> AsyncIterator[str]:
        """Count one more stream of ``key_id`` and return ``events`` wrapped to count it out when it ends.

        Raises:
            Problem: 429 with ``Retry-After`` when the key, or the gateway, has as many streams open as allowed.
        """
        with self._lock:
            if self._open[key_id] >= self.per_key:
                raise Problem(
                    429,
                    "Too many open streams",
                    f"this key has {self._open[key_id]} event streams open and may have {self.per_key}: close one "
                    "(one stream per evaluation is enough; the runs list follows many in one)",
                    headers={"Retry-After": str(STREAM_RETRY_AFTER_S)},
                )
            if sum(self._open.values()) >= self.total:
                raise Problem(
                    429,
                    "Too many open streams",
                    f"the gateway has {self.total} event streams open, its limit: retry later, or poll the "
                    "evaluation instead (GET /v1/evaluations/{id})",
                    headers={"Retry-After": str(STREAM_RETRY_AFTER_S)},
                )
            self._open[key_id] += 1
        return self._counted(key_id, events)

    async def _counted(self, key_id: str, events: AsyncIterator[str]) -> AsyncIterator[str]:
        try:
            async for event in events:
                yield event
        finally:
            with self._lock:
                self._open[key_id] -= 1
                if self._open[key_id] <= 0:
                    del self._open[key_id]


def event_response(
    streams: OpenStreams, key_id: str, state: StateStore, evaluation_ids: list[str], *, verdicts: bool
) -> StreamingResponse:
    """The response of an event stream of ``evaluation_ids`` (their access already checked), counted among
    ``key_id``'s open streams: the REST API's and the dashboard's streams alike.

    Raises:
        Problem: 429 when the key, or the gateway, has as many streams open as allowed.
    """
    return StreamingResponse(
        streams.open(key_id, follow(state, evaluation_ids, verdicts=verdicts)),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
