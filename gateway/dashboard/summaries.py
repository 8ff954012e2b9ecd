"""What an evaluation page shows of each task's trajectory (end reason, tokens, wall time, cell errors), read from
the artifact store once per stored trajectory and kept in memory.

A trajectory file is written once per attempt (a rewrite replaces it atomically), so a summary is kept under the
file's path, size and modification time and read again only when one of them changes.
"""

import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from services.errors import StoreError
from services.store import ArtifactStore
from services.trajectory import Trajectory

DEFAULT_CACHE_ENTRIES = 20_000
"""Summaries kept in memory (a few hundred bytes each)."""


@dataclass(frozen=True)
class TaskSummary:
    """The figures of one task session, as the evaluation page's table and totals show them."""

    end_reason: str
    turns: int
    prompt_tokens: int
    completion_tokens: int
    wall_s: float
    cells: int
    failed_cells: int
    """Cells that raised, timed out or lost their kernel."""

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def summarise(trajectory: Trajectory) -> TaskSummary:
    """The summary of a trajectory. Raises nothing."""
    executions = [turn.execution for turn in trajectory.turns if turn.execution is not None]
    return TaskSummary(
        end_reason=trajectory.end_reason.value,
        turns=trajectory.assistant_turns,
        prompt_tokens=trajectory.prompt_tokens or 0,
        completion_tokens=trajectory.completion_tokens or 0,
        wall_s=trajectory.wall_s,
        cells=len(executions),
        failed_cells=sum(1 for execution in executions if not execution.ok),
    )


class SummaryCache:
    """Trajectory summaries by file identity, least recently used dropped first; safe across threads."""

    def __init__(self, entries: int = DEFAULT_CACHE_ENTRIES) -> None:
        self._entries = entries
        self._items: OrderedDict[tuple[str, int, int], TaskSummary] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, store: ArtifactStore, evaluation_id: str, task_index: int, attempt: int) -> TaskSummary | None:
        """The summary of a task attempt's trajectory, or None when it has none (yet) or it cannot be read.

        Raises:
            StoreError: the evaluation id is not a valid one.
        """
        path = store.trajectory_path(evaluation_id, task_index, attempt)
        try:
            stat = path.stat()
        except OSError:
            return None
        key = (str(path), stat.st_size, stat.st_mtime_ns)
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
                return found
        summary = self._read(path)
        if summary is None:
            return None
        with self._lock:
            self._items[key] = summary
            while len(self._items) > self._entries:
                self._items.popitem(last=False)
        return summary

    @staticmethod
    def _read(path: Path) -> TaskSummary | None:
        try:
            return summarise(Trajectory.model_validate_json(path.read_bytes()))
        except (OSError, ValueError, StoreError):
            return None


CACHE = SummaryCache()
"""The gateway process's cache."""
