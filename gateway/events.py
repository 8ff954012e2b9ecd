"""Server-sent events of one evaluation: its progress as it changes, each verdict as it comes, then the end."""

import json
import time
from collections.abc import Iterator

from services.state import StateStore

POLL_S = 0.5
"""How often Redis is read for changes."""

HEARTBEAT_S = 15.0
"""A comment line this often keeps proxies from closing a quiet stream."""

MAX_STREAM_S = 6 * 3600.0
"""A stream ends after this long even if the evaluation has not (the client reconnects)."""


def _event(name: str, data: object) -> str:
    return f"event: {name}\ndata: {json.dumps(data, default=str)}\n\n"


def stream(state: StateStore, evaluation_id: str, *, poll_s: float = POLL_S) -> Iterator[str]:
    """Yield ``progress`` on each change, ``verdict`` per graded task, and ``end`` once every task is finished
    (or the evaluation is cancelled and nothing runs any more)."""
    last_progress: str | None = None
    sent: set[tuple[int, int, str]] = set()
    began = last_beat = time.monotonic()
    while time.monotonic() - began < MAX_STREAM_S:
        progress = state.progress(evaluation_id)
        status = state.status(progress, evaluation_id)
        snapshot = json.dumps({"status": status.value, **progress.model_dump(mode="json")})
        if snapshot != last_progress:
            last_progress = snapshot
            yield f"event: progress\ndata: {snapshot}\n\n"
        for verdict in state.verdicts(evaluation_id):
            key = (verdict.task_index, verdict.attempt, verdict.status.value)
            if key not in sent:
                sent.add(key)
                yield _event("verdict", verdict.model_dump(mode="json"))
        if progress.complete:
            yield _event("end", {"status": status.value})
            return
        if time.monotonic() - last_beat > HEARTBEAT_S:
            last_beat = time.monotonic()
            yield ": still running\n\n"
        time.sleep(poll_s)
