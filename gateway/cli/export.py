"""``export``: an evaluation's results, its trajectories in PyBench's ``trajectory.jsonl`` and, on request,
one notebook and the saved files per task, written to a folder from one download of the evaluation's archive::

    <out>/results.json
    <out>/manifest.json                 what the run ran with (``services.results.manifest``)
    <out>/trajectory.jsonl              one line per task that ran: ``messages`` + index, category1, user
    <out>/notebooks/<task>.ipynb        with --notebooks
    <out>/files/<task>/<name>           with --files: what each session saved under ./output
"""

import importlib
import importlib.util
import json
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from gateway.client import GatewayClient
from gateway.notebook import build_notebook
from services.pybench.rules import task_query
from services.trajectory import Trajectory

from .errors import CommandError, UsageError


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
    """Write the evaluation's results, trajectories and (optionally) notebooks and saved files under ``out``, from
    one download of its archive (``GET /v1/evaluations/<id>/archive``): a full suite takes one request.

    ``categories``: the suite's tasks by index (``category1``, ``paper_category``), for the records' fields.

    Raises:
        UsageError: ``notebooks`` without nbformat installed.
        CommandError: a file cannot be written, or the archive is not one this service makes.
        GatewayError: the gateway answered with an error status.
        GatewayUnreachableError: no answer.
    """
    if notebooks and importlib.util.find_spec("nbformat") is None:
        raise UsageError("--notebooks needs nbformat: pip install nbformat")
    with tempfile.TemporaryDirectory(prefix="pbe-export-") as scratch:
        path = Path(scratch) / "archive.tar.gz"
        try:
            client.archive(evaluation_id, path)
        except OSError as exc:
            raise CommandError(f"cannot write the download to {scratch}: {exc}; free space in $TMPDIR") from exc
        contents = read_archive(path, evaluation_id)
        return _write_export(contents, out, notebooks=notebooks, files=files, categories=categories or {})


@dataclass
class ArchiveContents:
    """What an evaluation's archive holds: the results document, and per task its trajectory and saved files."""

    results: bytes = b""
    manifest: dict[str, Any] | None = None
    """The evaluation's run manifest (``services.results.manifest``), from its ``evaluation.json``."""
    tasks: list[int] = field(default_factory=list)
    """The evaluation's tasks, from its ``evaluation.json``."""
    trajectories: dict[int, Trajectory] = field(default_factory=dict)
    files: dict[int, dict[str, bytes | None]] = field(default_factory=dict)
    """Per task, saved files by name relative to ./output; None marks a folder left empty (``name/``)."""


def read_archive(path: Path, evaluation_id: str) -> ArchiveContents:
    """Read an archive the gateway made. Members outside ``<evaluation>/`` and anything but files and folders
    (links, devices) are refused.

    Raises:
        CommandError: the file is not a gzip'd tar, or holds a member it should not.
    """
    contents = ArchiveContents()
    try:
        with tarfile.open(path, mode="r:gz") as archive:
            for member in archive:
                _read_member(archive, member, evaluation_id, contents)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise CommandError(f"the archive of {evaluation_id} is unreadable ({exc}); run the export again") from exc
    return contents


def _read_member(archive: tarfile.TarFile, member: tarfile.TarInfo, evaluation_id: str, into: ArchiveContents) -> None:
    """Raises: CommandError: a member that is neither a file nor a folder, or outside the evaluation's tree."""
    parts = PurePosixPath(member.name).parts
    if not parts or parts[0] != evaluation_id or ".." in parts or not (member.isfile() or member.isdir()):
        raise CommandError(f"the archive of {evaluation_id} holds an unexpected member {member.name!r}")
    rest = parts[1:]
    data = archive.extractfile(member).read() if member.isfile() else None  # type: ignore[union-attr]
    if rest == ("results.json",):
        into.results = data or b""
    elif rest == ("evaluation.json",) and data is not None:
        evaluation = json.loads(data)
        into.tasks = [int(t) for t in evaluation.get("tasks", [])]
        into.manifest = evaluation.get("manifest")
    elif len(rest) == 3 and rest[0] == "tasks" and rest[2] == "trajectory.json" and data is not None:
        into.trajectories[int(rest[1])] = Trajectory.model_validate_json(data)
    elif len(rest) > 3 and rest[0] == "tasks" and rest[2] == "output":
        name = "/".join(rest[3:]) + ("/" if member.isdir() else "")
        into.files.setdefault(int(rest[1]), {})[name] = data


def _write_export(
    contents: ArchiveContents,
    out: Path,
    *,
    notebooks: bool,
    files: bool,
    categories: dict[int, dict[str, Any]],
) -> ExportReport:
    """Raises: CommandError: a file cannot be written."""
    results = json.loads(contents.results) if contents.results else {}
    _write(out / "results.json", json.dumps(results, indent=1, ensure_ascii=False).encode())
    if contents.manifest is not None:
        _write(out / "manifest.json", json.dumps(contents.manifest, indent=1, ensure_ascii=False).encode())
    report = ExportReport()
    lines = []
    for index, trajectory in sorted(contents.trajectories.items()):
        task = categories.get(index, {})
        fields = {
            "index": str(index),
            "category1": task.get("category1", ""),
            "user": task_query(trajectory.messages) or "",  # as written: PyBench's ``user`` keeps its spaces
        }
        lines.append(json.dumps(trajectory.pybench_record(fields), ensure_ascii=False))
        report.trajectories.append(index)
        if notebooks:
            path = out / "notebooks" / f"{index}.ipynb"
            _write(path, _notebook(trajectory, task.get("paper_category")).encode())
            report.notebooks.append(path)
        if files:
            report.files += _save_files(contents.files.get(index, {}), out / "files" / str(index))
    report.missing = sorted(set(contents.tasks) - set(contents.trajectories))
    _write(out / "trajectory.jsonl", "".join(line + "\n" for line in lines).encode())
    return report


def _notebook(trajectory: Trajectory, category: str | None) -> str:
    nbformat: Any = importlib.import_module("nbformat")  # untyped: used as Any
    text: str = nbformat.writes(build_notebook(trajectory, category))
    return text


def _save_files(saved: dict[str, bytes | None], folder: Path) -> list[Path]:
    """Write a task's saved files into ``folder``, refusing names that would leave it.

    Raises:
        CommandError: a file cannot be written.
    """
    written = []
    base = folder.resolve()
    for name, data in sorted(saved.items()):
        target = (base / name).resolve()
        if not target.is_relative_to(base) or target == base:
            continue
        if data is None:  # a folder the session left empty
            target.mkdir(parents=True, exist_ok=True)
            continue
        _write(target, data)
        written.append(target)
    return written
