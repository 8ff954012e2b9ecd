"""The one reader of PyBench's recorded trajectories (``trajectory.jsonl``).

Each line is one JSON object: ``messages`` (system, data message, query, then assistant replies and code
interpreter messages, each ``{"role", "content"}``) plus the task's fields (``index`` as a string, ``user`` the
query, ``category1``, ...). PyBench's file records 135 of its 143 tasks, one line each. Blank lines are skipped.
"""

import json
from collections.abc import Generator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.errors import SuiteError, TaskNotFoundError
from services.pybench.rules import task_query


@dataclass(frozen=True)
class RecordedTrajectory:
    """One line of a ``trajectory.jsonl``."""

    index: int | None
    """The task's index (``index``, a string in PyBench's file); None when the line has none."""
    query: str
    """The task's query, stripped: the ``user`` field when it is a non-empty string, else the first user
    message that does not start with ``[INFO]``; empty when there is neither."""
    messages: list[dict[str, str]]
    """The conversation, each message reduced to ``role`` and ``content`` as strings (content '' when missing)."""
    record: dict[str, Any]
    """The whole line as read."""

    @property
    def replies(self) -> list[str]:
        """The assistant messages' contents, in order."""
        return [message["content"] for message in self.messages if message["role"] == "assistant"]


def _parse(line: str, path: Path, number: int) -> RecordedTrajectory:
    """Raises: SuiteError: the line is not a recorded trajectory."""

    def refuse(what: str) -> SuiteError:
        return SuiteError(
            f"{path}, line {number}: not a recorded trajectory ({what}); each line must be a JSON object with a "
            "'messages' list of {'role', 'content'} objects: fix or remove the line, or use PyBench's own file"
        )

    try:
        record = json.loads(line)
    except ValueError as exc:
        raise refuse(f"not JSON: {exc}") from exc
    if not isinstance(record, dict):
        raise refuse(f"a JSON {type(record).__name__}, not an object")
    raw_messages = record.get("messages")
    if not isinstance(raw_messages, list):
        raise refuse("no 'messages' list")
    messages = []
    for position, message in enumerate(raw_messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise refuse(f"message {position} has no 'role'")
        content = message.get("content")
        messages.append({"role": message["role"], "content": "" if content is None else str(content)})
    index = None
    if record.get("index") is not None:
        try:
            index = int(str(record["index"]))
        except ValueError as exc:
            raise refuse(f"'index' {record['index']!r} is not a task index") from exc
    user = record.get("user")
    query = user if isinstance(user, str) and user.strip() else task_query(messages) or ""
    return RecordedTrajectory(index=index, query=query.strip(), messages=messages, record=record)


def _recordings(path: Path) -> Generator[RecordedTrajectory, None, None]:
    """Parse the file line by line, lazily.

    Raises:
        SuiteError: the file cannot be read, or a line is not a recorded trajectory.
    """
    try:
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if line.strip():
                    yield _parse(line, path, number)
    except (OSError, UnicodeDecodeError) as exc:
        raise SuiteError(
            f"cannot read recorded trajectories at {path}: {exc}; give the path of a PyBench trajectory.jsonl "
            "(UTF-8, one JSON object a line)"
        ) from exc


def read_recordings(path: str | Path) -> list[RecordedTrajectory]:
    """Return every recorded trajectory of a ``trajectory.jsonl``, in file order.

    Raises:
        SuiteError: the file cannot be read, or a line is not a recorded trajectory (the message names the line).
    """
    return list(_recordings(Path(path)))


def recording_of(path: str | Path, task_index: int) -> RecordedTrajectory:
    """Return the recorded trajectory of task ``task_index``; when several lines record it, the first wins.

    Lines are read up to the task's line only.

    Raises:
        SuiteError: the file cannot be read, or a line before the task's is not a recorded trajectory.
        TaskNotFoundError: no line records that task (PyBench's file has 135 of the 143 tasks).
    """
    path = Path(path)
    with closing(_recordings(path)) as recordings:
        for recording in recordings:
            if recording.index == task_index:
                return recording
    raise TaskNotFoundError(
        f"{path} records no trajectory of task {task_index}; use a task that it records, or judge it without a "
        "reference (absolute mode)"
    )
