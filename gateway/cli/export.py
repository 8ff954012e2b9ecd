"""``export``: an evaluation's results, its trajectories in PyBench's ``trajectory.jsonl`` and, on request,
one notebook and the saved files per task, written to a folder::

    <out>/results.json
    <out>/trajectory.jsonl              one line per task that ran: ``messages`` + index, category1, user
    <out>/notebooks/<task>.ipynb        with --notebooks
    <out>/files/<task>/<name>           with --files: what each session saved under ./output
"""

import importlib
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.client import GatewayClient, GatewayError
from services.pybench import task_query
from services.trajectory import Trajectory

from .errors import CommandError, UsageError
from .notebook import build_notebook


@dataclass
class ExportReport:
    """What ``export`` wrote, and the tasks it found no trajectory of."""

    trajectories: list[int] = field(default_factory=list)
    notebooks: list[Path] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)


def _write(path: Path, data: bytes) -> None:
    """Raises:
    CommandError: the file cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    except OSError as exc:
        raise CommandError(f"cannot write {path}: {exc.strerror or exc}; choose another --out") from exc


def export(
    client: GatewayClient,
    evaluation_id: str,
    out: Path,
    *,
    notebooks: bool = False,
    files: bool = False,
    categories: dict[int, dict[str, Any]] | None = None,
) -> ExportReport:
    """Write the evaluation's results, trajectories and (optionally) notebooks and saved files under ``out``.

    ``categories``: the suite's tasks by index (``category1``, ``paper_category``), for the records' fields.

    Raises:
        UsageError: ``notebooks`` without nbformat installed.
        CommandError: a file cannot be written.
        GatewayError: the gateway answered with an error status (other than a task without a trajectory).
        GatewayUnreachableError: no answer.
    """
    if notebooks and importlib.util.find_spec("nbformat") is None:
        raise UsageError("--notebooks needs nbformat: pip install nbformat")
    view = client.evaluation(evaluation_id)
    results = client.results(evaluation_id)
    _write(out / "results.json", json.dumps(results, indent=1, ensure_ascii=False).encode())
    report = ExportReport()
    lines = []
    tasks = categories or {}
    for index in view["evaluation"]["tasks"]:
        try:
            trajectory = Trajectory.model_validate(client.trajectory(evaluation_id, int(index)))
        except GatewayError as exc:
            if exc.status != 404:
                raise
            report.missing.append(int(index))
            continue
        task = tasks.get(trajectory.task_index, {})
        fields = {
            "index": str(trajectory.task_index),
            "category1": task.get("category1", ""),
            "user": task_query(trajectory.messages) or "",  # as written: PyBench's ``user`` keeps its spaces
        }
        lines.append(json.dumps(trajectory.pybench_record(fields), ensure_ascii=False))
        report.trajectories.append(trajectory.task_index)
        if notebooks:
            notebook = _notebook(trajectory, task.get("paper_category"))
            path = out / "notebooks" / f"{trajectory.task_index}.ipynb"
            _write(path, notebook.encode())
            report.notebooks.append(path)
        if files:
            report.files += _download_files(client, trajectory, out / "files" / str(trajectory.task_index))
    _write(out / "trajectory.jsonl", "".join(line + "\n" for line in lines).encode())
    return report


def _notebook(trajectory: Trajectory, category: str | None) -> str:
    nbformat: Any = importlib.import_module("nbformat")  # untyped: used as Any
    text: str = nbformat.writes(build_notebook(trajectory, category))
    return text


def _download_files(client: GatewayClient, trajectory: Trajectory, folder: Path) -> list[Path]:
    """Download what the session saved into ``folder``, refusing names that would leave it.

    Raises:
        CommandError: a file cannot be written.
        GatewayError, GatewayUnreachableError: as the client raises them.
    """
    written = []
    base = folder.resolve()
    for name in client.files(trajectory.evaluation_id, trajectory.task_index, trajectory.attempt):
        relative = name.removeprefix("./").removeprefix("output/")
        target = (base / relative).resolve()
        if not target.is_relative_to(base) or target == base:
            continue
        if name.endswith("/"):  # a folder the session left empty
            target.mkdir(parents=True, exist_ok=True)
            continue
        data = client.download(trajectory.evaluation_id, trajectory.task_index, name, trajectory.attempt)
        _write(target, data)
        written.append(target)
    return written
