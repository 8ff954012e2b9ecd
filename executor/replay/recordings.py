"""Recorded trajectories indexed by task query: what the replay model answers with.

A PyBench ``trajectory.jsonl`` holds one JSON object a line: ``messages`` (system, user, assistant, ...) plus
the task's fields (``index``, ``user`` the query, ...). A task is found by its query: the first user message
that is not an ``[INFO]`` message.
"""

import json
from pathlib import Path
from typing import Any

from services.errors import ConfigurationError

INFO_PREFIX = "[INFO]"
"""User messages the harness writes (data locations, code output) start with this; the query does not."""


def task_query(messages: list[dict[str, Any]]) -> str | None:
    """Return the task's query in a conversation: its first user message that is not an ``[INFO]`` one."""
    for message in messages:
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, str) and not content.startswith(INFO_PREFIX):
            return content.strip()
    return None


class Recordings:
    """The recorded assistant messages of each task, by query."""

    def __init__(self, by_query: dict[str, list[str]], indices: dict[str, int]) -> None:
        self.by_query = by_query
        self.indices = indices

    def __len__(self) -> int:
        return len(self.by_query)

    def reply(self, query: str, turn: int) -> str | None:
        """Return the recorded assistant message ``turn`` (from 0) of the task, or None past its end.

        Raises:
            KeyError: no recording has that query.
        """
        replies = self.by_query[query.strip()]
        return replies[turn] if turn < len(replies) else None


def load_recordings(path: Path) -> Recordings:
    """Read a PyBench ``trajectory.jsonl``.

    Raises:
        ConfigurationError: the file is missing or a line is not a recorded trajectory.
    """
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigurationError(
            f"cannot read recorded trajectories at {path}: {exc}; pass --trajectories PATH to a trajectory.jsonl"
        ) from exc
    by_query: dict[str, list[str]] = {}
    indices: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            messages = record["messages"]
            query = task_query(messages)
            replies = [str(m["content"]) for m in messages if m["role"] == "assistant"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigurationError(f"{path}, line {number}: not a recorded trajectory ({exc})") from exc
        if query is None:
            raise ConfigurationError(f"{path}, line {number}: the trajectory has no task query")
        by_query[query] = replies
        if "index" in record:
            indices[query] = int(record["index"])
    return Recordings(by_query, indices)
