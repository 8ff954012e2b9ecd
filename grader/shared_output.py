"""The shared ``./output`` of PyBench's harness, as the ``original`` grading sees it.

The benchmark's harness runs every task of a run in one process and one working folder, one task after another
in index order, and runs the unit tests once the whole run is over (its test entry point reads the finished
trajectories). Every test therefore sees one ``./output`` holding what every task of the run saved, and a test
that names another task's file passes when that task produced it: task 68's test checks ``./output/67.png``,
task 82's ``./output/81.png``. Here each session has a sandbox and an output folder of its own, so the
``original`` grading rebuilds that view, for the names its checks ask about and nothing else:

- a path an original check names under ``./output`` whose first component starts with another task's index
  (``67.png``, ``67_a.csv``, ``67/``) is *foreign* when that task is in the same evaluation: it is looked up in
  that task's final attempt (the attempt of its recorded verdict) in the artifact store. A task that has no
  recorded verdict (still running, cancelled, retried and not yet graded again) lends nothing.
- Order: the tests ran after the whole run, so the other task's file counts whether its index is smaller or
  larger. Where both tasks saved the same name, the harness kept the later writer's, that of the larger index.
- The ``fixed`` grading never borrows: it reads each task's own files only.

Which tasks borrow from which is decided by the checks alone (``dependencies``). Since a task may be graded
before the task it borrows from has finished, ``grader.jobs`` grades both under one lock per evaluation and
regrades a borrower's original grading when a task it borrows from gets its final verdict (see there).
"""

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grader.checks import normalise_output_path
from grader.variants import Grading, checks_for, forced_outcome
from services.errors import ArtifactExpiredError
from services.pybench.suite import Suite
from services.state import StateStore
from services.store import ArtifactStore
from services.verdict import VerdictStatus

_LEADING_INDEX = re.compile(r"^(\d+)(?=[._/-]|$)")
"""A task index at the start of an output name: ``67.png``, ``67_1.png``, ``67/``, ``67``."""


@dataclass(frozen=True)
class Borrowed:
    """Files of other tasks of the evaluation that a task's original grading sees, by ``./output/...`` name.

    ``files``: name to the file (or folder, for a name ending in ``/``) in the artifact store.
    ``lenders``: name to the (task, attempt) it comes from.
    """

    files: dict[str, Path] = field(default_factory=dict)
    lenders: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.files)


def named_outputs(check: dict[str, Any]) -> list[str]:
    """The ``./output/...`` paths a check's parameters name, spelled ``./output/x`` (no trailing ``/``)."""
    names: list[str] = []
    for value in check.values():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and item.removeprefix("./").startswith("output/"):
                names.append(normalise_output_path(item).rstrip("/"))
    return names


def task_of(name: str) -> int | None:
    """The task index an output name carries (``./output/67.png`` -> 67), or None (``./output/result.csv``)."""
    relative = normalise_output_path(name).removeprefix("./output/")
    match = _LEADING_INDEX.match(relative)
    return int(match.group(1)) if match else None


def original_checks(suite: Suite, task_index: int) -> list[dict[str, Any]]:
    """The checks the original grading runs for a task (none when its outcome is forced, or it is not in the suite)."""
    task = suite.tasks.get(task_index)
    if task is None or forced_outcome(task_index, Grading.ORIGINAL) is not None:
        return []
    return checks_for(task_index, task.checks, Grading.ORIGINAL)


def foreign_names(task_index: int, checks: list[dict[str, Any]], evaluation_tasks: Iterable[int]) -> dict[str, int]:
    """The paths ``checks`` name that belong to another task of the evaluation: path to that task."""
    others = set(evaluation_tasks) - {task_index}
    found: dict[str, int] = {}
    for check in checks:
        for name in named_outputs(check):
            owner = task_of(name)
            if owner in others:
                found[name] = owner
    return found


def dependencies(suite: Suite, evaluation_tasks: Iterable[int]) -> dict[int, dict[str, int]]:
    """Of an evaluation's tasks, those whose original checks name other tasks' files: task to its foreign names
    (path to the task that lends it). Tasks 68 and 82 of PyBench, when 67 and 81 are in the evaluation too."""
    tasks = sorted(set(evaluation_tasks))
    links: dict[int, dict[str, int]] = {}
    for index in tasks:
        names = foreign_names(index, original_checks(suite, index), tasks)
        if names:
            links[index] = names
    return links


def involved(links: dict[int, dict[str, int]], task_index: int) -> bool:
    """Whether the task borrows files or lends them (its grading then takes the evaluation's borrowing lock)."""
    return task_index in links or any(task_index in names.values() for names in links.values())


def borrowers_of(links: dict[int, dict[str, int]], task_index: int) -> list[int]:
    """The tasks whose original grading sees files of ``task_index``."""
    return sorted(index for index, names in links.items() if task_index in names.values())


def final_attempts(state: StateStore, evaluation_id: str) -> dict[int, int]:
    """Each task with a recorded verdict (its attempt is final until a retry): task to that attempt."""
    return {
        verdict.task_index: verdict.attempt
        for verdict in state.verdicts(evaluation_id)
        if verdict.status is not VerdictStatus.UNAVAILABLE
    }


def borrow(
    store: ArtifactStore,
    evaluation_id: str,
    task_index: int,
    names: dict[str, int],
    own_files: Iterable[str],
    attempts: dict[int, int],
) -> Borrowed:
    """What the task's original grading sees of other tasks' files.

    Args:
        names: the task's foreign names (``dependencies``): path to the task that lends it.
        own_files: the names the task's session produced (``./output/...``).
        attempts: the lenders' final attempts (``final_attempts``); a lender missing from it lends nothing.

    Returns:
        For each foreign path, the lender's file of that name, or every file under it when it is a folder. A name
        the task produced itself stays the task's own unless the lender's index is larger (the later writer).
        Never raises for a missing output folder.
    """
    own = {normalise_output_path(name) for name in own_files}
    borrowed = Borrowed()
    for path, lender in sorted(names.items()):
        attempt = attempts.get(lender)
        if attempt is None:
            continue
        base = store.output_dir(evaluation_id, lender, attempt)
        try:
            lent = store.list_output_files(evaluation_id, lender, attempt)
        except ArtifactExpiredError:  # retention removed the lender's files: there is nothing to borrow
            continue
        for name in lent:
            if name.rstrip("/") != path and not name.startswith(path + "/"):
                continue
            if name in own and lender < task_index:
                continue
            borrowed.files[name] = base / name.removeprefix("./output/")
            borrowed.lenders[name] = (lender, attempt)
    return borrowed
