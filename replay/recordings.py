"""Recorded trajectories indexed by task query: what the replay model answers with.

The file is read by ``services.pybench.recordings`` (PyBench's ``trajectory.jsonl``); a task is found by its query,
stripped (``services.pybench.rules.task_query``: the first user message that is not an ``[INFO]`` message).
"""

from pathlib import Path

from services.errors import ConfigurationError, SuiteError
from services.pybench.recordings import read_recordings


class Recordings:
    """The recorded assistant messages of each task, by query (stripped)."""

    def __init__(self, by_query: dict[str, list[str]], indices: dict[str, int]) -> None:
        self.by_query = by_query
        self.indices = indices

    def __len__(self) -> int:
        return len(self.by_query)

    def __contains__(self, query: object) -> bool:
        return isinstance(query, str) and query.strip() in self.by_query

    def reply(self, query: str, turn: int) -> str | None:
        """Return the recorded assistant message ``turn`` (from 0) of the task, or None past its end.

        Raises:
            KeyError: no recording has that query.
        """
        replies = self.by_query[query.strip()]
        return replies[turn] if turn < len(replies) else None


def load_recordings(path: Path) -> Recordings:
    """Read a PyBench ``trajectory.jsonl``; when two lines have the same query, the last wins.

    Raises:
        ConfigurationError: the file is missing, a line is not a recorded trajectory, or one has no task query.
    """
    try:
        recorded = read_recordings(path)
    except SuiteError as exc:
        raise ConfigurationError(f"{exc} (the replay server reads the file given by --trajectories PATH)") from exc
    by_query: dict[str, list[str]] = {}
    indices: dict[str, int] = {}
    for number, recording in enumerate(recorded, start=1):
        if not recording.query:
            raise ConfigurationError(
                f"{path}: recording {number} has no task query; give each line a 'user' field or a user message "
                "that does not start with [INFO]"
            )
        by_query[recording.query] = recording.replies
        if recording.index is not None:
            indices[recording.query] = recording.index
    return Recordings(by_query, indices)
