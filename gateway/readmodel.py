"""What an evaluation looks like to a reader: its status and progress, its results document, which attempt of a task
is meant, the files an attempt produced, and the progress events a live stream sends. The REST routes
(``routers/``), the dashboard (``dashboard/``), the archive (``archive.py``) and the event streams (``streams.py``)
all read an evaluation through this module, so that each of them shows the same thing.

It reads the live state (``services.state``) and the artifact store (``services.store``, which alone knows the
store's file names); it writes nothing and checks no access (``routers.evaluations.owned`` does, before it).
"""

import json
from dataclasses import dataclass, field
from pathlib import Path

from services.errors import TaskNotFoundError
from services.evaluation import Evaluation, EvaluationStatus, EvaluationView
from services.results.scores import build_results
from services.state import StateStore
from services.store import ArtifactStore
from services.verdict import Results, Verdict, VerdictStatus

RETRYABLE = (VerdictStatus.FAILED, VerdictStatus.INFRA_ERROR, VerdictStatus.UNGRADABLE)
"""The verdicts a task may be run again from (``POST .../retry``, the dashboard's retry button)."""

# --- status and results -----------------------------------------------------------------------------------------


def view(state: StateStore, evaluation: Evaluation) -> EvaluationView:
    """The evaluation with its status and progress (the answer of ``GET /v1/evaluations/{id}``)."""
    progress = state.progress(evaluation.id)
    return EvaluationView(evaluation=evaluation, status=state.status(progress, evaluation.id), progress=progress)


def status(state: StateStore, evaluation_id: str) -> EvaluationStatus:
    """Where the evaluation stands (queued, running, completed or cancelled)."""
    return state.status(state.progress(evaluation_id), evaluation_id)


def results(state: StateStore, evaluation: Evaluation) -> Results:
    """The results document so far: every verdict by task, their metrics at the evaluation's prices, and the
    statistics (``services.results.scores.build_results``); ``complete`` once every task is finished."""
    return build_results(evaluation.id, state.verdicts(evaluation.id), state.complete(evaluation.id), evaluation.prices)


# --- attempts -----------------------------------------------------------------------------------------------------


def _check_task(evaluation: Evaluation, task_index: int) -> None:
    """Raises: TaskNotFoundError: the evaluation has no such task."""
    if task_index not in evaluation.tasks:
        raise TaskNotFoundError(f"evaluation {evaluation.id} has no task {task_index}; its tasks: {evaluation.tasks}")


def latest_attempt(state: StateStore, evaluation: Evaluation, task_index: int) -> int:
    """The attempt the task is at (1 until it is run again).

    Raises:
        TaskNotFoundError: the evaluation has no such task.
    """
    _check_task(evaluation, task_index)
    return state.task_attempt(evaluation.id, task_index)


def chosen_attempt(state: StateStore, evaluation: Evaluation, task_index: int, asked: int | None) -> int:
    """The attempt a reader asked for, else the task's latest.

    Raises:
        TaskNotFoundError: the evaluation has no such task.
    """
    if asked is None:
        return latest_attempt(state, evaluation, task_index)
    _check_task(evaluation, task_index)
    return asked


def latest_attempts(state: StateStore, evaluation: Evaluation) -> list[tuple[int, int]]:
    """Each task of the evaluation with its latest attempt, as (task, attempt) pairs in the evaluation's order."""
    return list(state.task_attempts(evaluation.id, evaluation.tasks).items())


def attempt_verdict(
    state: StateStore, store: ArtifactStore, evaluation_id: str, task_index: int, attempt: int
) -> Verdict | None:
    """The verdict of one attempt: the live one when it is of that attempt, else the one stored with the attempt,
    else None (not graded).

    Raises:
        StoreError: the evaluation id is not a valid one, or a stored verdict cannot be read.
    """
    live = next((v for v in state.verdicts(evaluation_id) if v.task_index == task_index), None)
    if live is not None and live.attempt == attempt:
        return live
    return store.get_verdict(evaluation_id, task_index, attempt) if live is not None else None


# --- output files -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputFile:
    """A file (or a folder left empty) an attempt produced under ``./output``."""

    name: str
    """The name relative to ``./output``; a folder's ends in ``/``."""
    path: Path | None
    """Where it is stored; None for a folder."""


def output_files(store: ArtifactStore, evaluation_id: str, task_index: int, attempt: int) -> list[OutputFile]:
    """What the attempt saved under ``./output``, in name order.

    Raises:
        ArtifactExpiredError: retention removed the attempt's files.
        StoreError: the evaluation id is not a valid one.
    """
    return [
        OutputFile(
            name.removeprefix("./output/"),
            None if name.endswith("/") else store.output_file(evaluation_id, task_index, attempt, name),
        )
        for name in store.list_output_files(evaluation_id, task_index, attempt)
    ]


def output_file(store: ArtifactStore, evaluation_id: str, task_index: int, attempt: int, name: str) -> Path | None:
    """The file the attempt saved as ``name`` (as listed, ``./output/`` optional), or None when it saved none of
    that name (a name that leaves its output folder is none).

    Raises:
        ArtifactExpiredError: there is none because retention removed the attempt's files.
        StoreError: the evaluation id is not a valid one.
    """
    path = store.output_file(evaluation_id, task_index, attempt, name)
    if path is None:
        store.check_kept(evaluation_id, [(task_index, attempt)])
    return path


# --- progress events ----------------------------------------------------------------------------------------------


@dataclass
class ProgressLook:
    """What one look at the live state saw of the evaluations a stream follows."""

    progress: dict[str, str] = field(default_factory=dict)
    """Each evaluation's ``progress`` event data (JSON text, keys sorted: equal text means no change)."""
    complete: dict[str, bool] = field(default_factory=dict)
    status: dict[str, str] = field(default_factory=dict)
    verdicts: list[Verdict] = field(default_factory=list)
    """Every verdict of the evaluations, when the look was asked for them."""


def look(state: StateStore, evaluation_ids: list[str], *, with_verdicts: bool) -> ProgressLook:
    """The progress of ``evaluation_ids`` now (and their verdicts when ``with_verdicts``).

    Raises:
        redis.RedisError: Redis cannot be read.
    """
    seen = ProgressLook()
    for evaluation_id in evaluation_ids:
        progress = state.progress(evaluation_id)
        current = state.status(progress, evaluation_id).value
        data = {"evaluation_id": evaluation_id, "status": current, **progress.model_dump(mode="json")}
        seen.progress[evaluation_id] = json.dumps(data, sort_keys=True)
        seen.complete[evaluation_id] = progress.complete
        seen.status[evaluation_id] = current
        if with_verdicts:
            seen.verdicts.extend(state.verdicts(evaluation_id))
    return seen
