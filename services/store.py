"""The artifact store: a directory laid out so a finished evaluation can be read without the service.

::

    <root>/evaluations/<evaluation>/evaluation.json
    <root>/evaluations/<evaluation>/results.json
    <root>/evaluations/<evaluation>/tasks/<task>/attempt-<n>/trajectory.json
    <root>/evaluations/<evaluation>/tasks/<task>/attempt-<n>/output/...      files the session produced
    <root>/evaluations/<evaluation>/tasks/<task>/attempt-<n>/verdict.json
    <root>/evaluations/<evaluation>/expired.json          what retention removed, when, under which setting

Every write is atomic (a temporary file renamed into place), so a reader never sees half a file and a
repeated write of the same (evaluation, task, attempt) replaces rather than duplicates.

Retention (``services.live.retention``) removes the heavy artifacts of old evaluations, each attempt's
``trajectory.json`` and ``output/``, through ``expire``; the records (``evaluation.json``, ``results.json``, the
verdicts) stay. A read of a removed artifact raises ``ArtifactExpiredError``, which says when and why, instead of
``ArtifactNotFoundError``. ``artifact_bytes`` measures the same artifacts: what a key's storage quota counts is
exactly what retention frees.
"""

import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from stat import S_ISDIR, S_ISREG
from typing import NamedTuple, TypeVar

from pydantic import BaseModel, ValidationError

from services.errors import ArtifactExpiredError, ArtifactNotFoundError, StoreError
from services.evaluation import Evaluation
from services.trajectory import Trajectory
from services.verdict import Results, Verdict

_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
ModelT = TypeVar("ModelT", bound=BaseModel)

EXPIRED_MARKER = "expired.json"
"""The file, in an evaluation's folder, that says which attempts' artifacts retention removed."""


class Expiry(BaseModel):
    """What ``ArtifactStore.expire`` removed from an evaluation (``expired.json``)."""

    expired_at: datetime
    """When the artifacts were removed (the latest removal, if there were several)."""
    setting: str
    """The setting that removed them, with its value (``PBE_RETENTION_DAYS=90``)."""
    reason: str
    """Why, in words (``finished more than 90 days ago``)."""
    attempts: list[tuple[int, int]]
    """The (task, attempt) pairs whose trajectory and produced files are gone."""

    def message(self, evaluation_id: str, task_index: int, attempt: int) -> str:
        """What ``ArtifactExpiredError`` says about one attempt: when, by which setting, and what is left."""
        return (
            f"the trajectory and files of task {task_index}, attempt {attempt} of evaluation {evaluation_id} were "
            f"removed on {self.expired_at:%Y-%m-%d %H:%M} UTC by {self.setting} ({self.reason}); its results and "
            f"verdicts are kept: read them with GET /v1/evaluations/{evaluation_id}/results"
        )


class Removal(NamedTuple):
    """What one ``ArtifactStore.expire`` removed."""

    attempts: int
    """Attempts whose trajectory and files were removed now (0: nothing was left to remove)."""
    bytes: int
    """The bytes freed."""


def _file_bytes(path: str | Path) -> int:
    """The size of ``path`` if it is a regular file (not a symbolic link), else 0."""
    try:
        info = os.lstat(path)
    except OSError:  # gone meanwhile
        return 0
    return info.st_size if S_ISREG(info.st_mode) else 0


def _tree_bytes(path: Path) -> int:
    """The bytes of the regular file ``path``, or of every regular file under the folder ``path``; 0 when it does
    not exist. Symbolic links are neither followed nor counted."""
    try:
        if not S_ISDIR(path.lstat().st_mode):
            return _file_bytes(path)
    except OSError:
        return 0
    return sum(_file_bytes(os.path.join(folder, name)) for folder, _, names in os.walk(path) for name in names)


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


class ArtifactStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def evaluation_dir(self, evaluation_id: str) -> Path:
        if not _ID.match(evaluation_id):
            raise StoreError(f"invalid evaluation id {evaluation_id!r}")
        return self.root / "evaluations" / evaluation_id

    def attempt_dir(self, evaluation_id: str, task_index: int, attempt: int) -> Path:
        return self.evaluation_dir(evaluation_id) / "tasks" / str(int(task_index)) / f"attempt-{int(attempt)}"

    def output_dir(self, evaluation_id: str, task_index: int, attempt: int) -> Path:
        return self.attempt_dir(evaluation_id, task_index, attempt) / "output"

    def _write(self, path: Path, data: bytes) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(tmp, path)
        except OSError as exc:
            raise StoreError(f"cannot write {path}: {exc}; check PBE_ARTIFACT_ROOT is writable") from exc

    def _name(self, path: Path) -> str:
        """``path`` as the store names it (relative to its root): an error a client may read shows no server path."""
        try:
            return str(path.relative_to(self.root))
        except ValueError:
            return path.name

    def _read(self, path: Path, model: type[ModelT]) -> ModelT:
        try:
            return model.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            raise ArtifactNotFoundError(f"no artifact {self._name(path)}") from None
        except (OSError, ValidationError) as exc:
            raise StoreError(f"cannot read {path}: {exc}") from exc

    def put_evaluation(self, evaluation: Evaluation) -> None:
        self._write(
            self.evaluation_dir(evaluation.id) / "evaluation.json", evaluation.model_dump_json(indent=1).encode()
        )

    def get_evaluation(self, evaluation_id: str) -> Evaluation:
        return self._read(self.evaluation_dir(evaluation_id) / "evaluation.json", Evaluation)

    def put_trajectory(self, trajectory: Trajectory) -> Path:
        path = self.attempt_dir(trajectory.evaluation_id, trajectory.task_index, trajectory.attempt) / "trajectory.json"
        self._write(path, trajectory.model_dump_json(indent=1).encode())
        return path

    def get_trajectory(self, evaluation_id: str, task_index: int, attempt: int) -> Trajectory:
        """The trajectory of one attempt.

        Raises:
            ArtifactExpiredError: retention removed it (the message says when and by which setting).
            ArtifactNotFoundError: the attempt has stored none (yet).
            StoreError: the evaluation id is not a valid one, or the file cannot be read.
        """
        try:
            return self._read(self.attempt_dir(evaluation_id, task_index, attempt) / "trajectory.json", Trajectory)
        except ArtifactNotFoundError:
            self.check_kept(evaluation_id, [(task_index, attempt)])
            raise

    def put_output_file(self, evaluation_id: str, task_index: int, attempt: int, relative: str, data: bytes) -> None:
        """Store one produced file under the attempt's ``output/``; a name ending in ``/`` is a folder the session
        left empty (made, with nothing in it).

        Raises:
            StoreError: the relative name would leave the output folder, or the write failed.
        """
        base = self.output_dir(evaluation_id, task_index, attempt)
        target = (base / relative).resolve()
        if not target.is_relative_to(base.resolve()) or target == base.resolve():
            raise StoreError(f"refusing output name {relative!r}: it leaves the output folder")
        if relative.endswith("/"):
            try:
                target.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot make {target}: {exc}; check PBE_ARTIFACT_ROOT is writable") from exc
            return
        self._write(target, data)

    def list_output_files(self, evaluation_id: str, task_index: int, attempt: int) -> list[str]:
        """Return the produced files as ``./output/...`` names, and empty folders as ``./output/.../``, sorted.

        Raises:
            ArtifactExpiredError: retention removed the attempt's files.
            StoreError: the evaluation id is not a valid one.
        """
        base = self.output_dir(evaluation_id, task_index, attempt)
        if not base.is_dir():
            self.check_kept(evaluation_id, [(task_index, attempt)])
            return []
        return sorted(
            "./output/" + p.relative_to(base).as_posix() + ("/" if p.is_dir() else "")
            for p in base.rglob("*")
            if not p.name.startswith(".")
            and not p.is_symlink()
            and (p.is_file() or (p.is_dir() and not any(p.iterdir())))
        )

    def put_verdict(self, verdict: Verdict) -> None:
        """Write the attempt's verdict (``verdict.json``); the verdict of an earlier grading it replaces is kept
        beside it as ``verdict-grading-<n>.json``.

        Raises:
            StoreError: the store cannot be written.
        """
        path = self.attempt_dir(verdict.evaluation_id, verdict.task_index, verdict.attempt) / "verdict.json"
        try:
            earlier = Verdict.model_validate_json(path.read_bytes())
        except (OSError, ValidationError):
            earlier = None
        if earlier is not None and earlier.grading < verdict.grading:
            self._write(path.with_name(f"verdict-grading-{earlier.grading}.json"), path.read_bytes())
        self._write(path, verdict.model_dump_json(indent=1).encode())

    def evaluation_ids(self) -> list[str]:
        """The ids of every evaluation stored (each has its ``evaluation.json``)."""
        base = self.root / "evaluations"
        if not base.is_dir():
            return []
        return sorted(p.parent.name for p in base.glob("*/evaluation.json") if _ID.match(p.parent.name))

    def latest_verdict(self, evaluation_id: str, task_index: int) -> Verdict | None:
        """The verdict of the task's latest graded attempt, or None."""
        base = self.evaluation_dir(evaluation_id) / "tasks" / str(int(task_index))
        found = sorted(base.glob("attempt-*/verdict.json"), key=lambda p: int(p.parent.name.removeprefix("attempt-")))
        return Verdict.model_validate_json(found[-1].read_bytes()) if found else None

    def has_trajectory(self, evaluation_id: str, task_index: int, attempt: int) -> bool:
        return (self.attempt_dir(evaluation_id, task_index, attempt) / "trajectory.json").is_file()

    def trajectory_path(self, evaluation_id: str, task_index: int, attempt: int) -> Path:
        """Where the attempt's trajectory is stored (or would be): for a reader that copies the file as it is, or
        keys a cache on its size and modification time.

        Raises:
            StoreError: the evaluation id is not a valid one.
        """
        return self.attempt_dir(evaluation_id, task_index, attempt) / "trajectory.json"

    def output_file(self, evaluation_id: str, task_index: int, attempt: int, name: str) -> Path | None:
        """The stored file the attempt produced under ``name`` (as ``list_output_files`` names it, ``./output/``
        optional), or None when there is none or the name leaves the attempt's output folder.

        Raises:
            StoreError: the evaluation id is not a valid one.
        """
        base = self.output_dir(evaluation_id, task_index, attempt).resolve()
        path = (base / name.removeprefix("./").removeprefix("output/")).resolve()
        if not path.is_relative_to(base) or not path.is_file():
            return None
        return path

    def get_verdict(self, evaluation_id: str, task_index: int, attempt: int) -> Verdict | None:
        """The attempt's stored verdict (of its latest grading), or None when it has none.

        Raises:
            StoreError: the evaluation id is not a valid one, or the file cannot be read.
        """
        try:
            return self._read(self.attempt_dir(evaluation_id, task_index, attempt) / "verdict.json", Verdict)
        except ArtifactNotFoundError:
            return None

    def put_results(self, results: Results) -> None:
        self._write(
            self.evaluation_dir(results.evaluation_id) / "results.json", results.model_dump_json(indent=1).encode()
        )

    # --- retention: what the heavy artifacts take, and their removal ----------------------------------------------

    def _attempt_dirs(self, evaluation_id: str) -> Iterator[tuple[int, int, Path]]:
        """Every stored attempt folder of the evaluation, as (task, attempt, folder)."""
        for folder in (self.evaluation_dir(evaluation_id) / "tasks").glob("*/attempt-*"):
            task, attempt = folder.parent.name, folder.name.removeprefix("attempt-")
            if task.isdigit() and attempt.isdigit() and folder.is_dir():
                yield int(task), int(attempt), folder

    def artifact_bytes(self, evaluation_id: str) -> int:
        """The bytes the evaluation's trajectories and produced files take (every attempt's): what ``expire``
        would free. The records (evaluation, results, verdicts: a few KiB) are not counted. One walk of the
        evaluation's folder: callers cache it (``services.live.retention``).

        Raises:
            StoreError: the evaluation id is not a valid one.
        """
        return sum(
            _tree_bytes(folder / "trajectory.json") + _tree_bytes(folder / "output")
            for _, _, folder in self._attempt_dirs(evaluation_id)
        )

    def finished_at(self, evaluation_id: str) -> datetime | None:
        """When the evaluation last finished, as the store shows it: ``results.json`` written (on completion);
        for an evaluation that wrote none (a cancelled one), its newest record (evaluation, trajectory, verdict).
        None when nothing of it is stored.

        Raises:
            StoreError: the evaluation id is not a valid one.
        """
        folder = self.evaluation_dir(evaluation_id)
        written = _mtime(folder / "results.json")
        if written is None:
            records = [folder / "evaluation.json"]
            for _, _, attempt in self._attempt_dirs(evaluation_id):
                records += [attempt / "trajectory.json", attempt / "verdict.json"]
            times = [t for t in map(_mtime, records) if t is not None]
            written = max(times) if times else None
        return datetime.fromtimestamp(written, UTC) if written is not None else None

    def expiry(self, evaluation_id: str) -> Expiry | None:
        """What retention removed from the evaluation (its ``expired.json``), or None when nothing.

        Raises:
            StoreError: the evaluation id is not a valid one, or the marker cannot be read.
        """
        try:
            return self._read(self.evaluation_dir(evaluation_id) / EXPIRED_MARKER, Expiry)
        except ArtifactNotFoundError:
            return None

    def check_kept(self, evaluation_id: str, attempts: Iterable[tuple[int, int]]) -> None:
        """Make sure retention removed none of ``attempts`` ((task, attempt) pairs).

        Raises:
            ArtifactExpiredError: it removed one: the message says which, when, and by which setting.
            StoreError: the evaluation id is not a valid one, or the marker cannot be read.
        """
        expiry = self.expiry(evaluation_id)
        if expiry is None:
            return
        removed = set(expiry.attempts)
        for task_index, attempt in attempts:
            if (task_index, attempt) in removed:
                raise ArtifactExpiredError(expiry.message(evaluation_id, task_index, attempt))

    def expire(self, evaluation_id: str, *, setting: str, reason: str, now: datetime | None = None) -> Removal:
        """Remove every attempt's trajectory and produced files (``output/``), keeping ``evaluation.json``,
        ``results.json`` and the verdicts, so results stay readable. ``expired.json`` records the attempts with
        ``setting`` and ``reason``; it is written before anything is removed, so a reader never finds an artifact
        gone without being told why. Running it again removes what a new attempt stored since, or nothing.

        Returns:
            How many attempts lost their artifacts now and the bytes freed; ``Removal(0, 0)`` when nothing was left
            to remove (and then nothing is written).

        Raises:
            StoreError: the evaluation id is not a valid one, or a file could not be written or removed (what is
                left is removed by the next call).
        """
        found = [
            (task, attempt, folder)
            for task, attempt, folder in self._attempt_dirs(evaluation_id)
            if os.path.lexists(folder / "trajectory.json") or os.path.lexists(folder / "output")
        ]
        if not found:
            return Removal(0, 0)
        previous = self.expiry(evaluation_id)
        attempts = {(task, attempt) for task, attempt, _ in found} | set(previous.attempts if previous else [])
        expiry = Expiry(expired_at=now or datetime.now(UTC), setting=setting, reason=reason, attempts=sorted(attempts))
        self._write(self.evaluation_dir(evaluation_id) / EXPIRED_MARKER, expiry.model_dump_json(indent=1).encode())
        return Removal(len(found), sum(self._remove_artifacts(folder) for _, _, folder in found))

    def _remove_artifacts(self, attempt_dir: Path) -> int:
        """Remove one attempt's trajectory and ``output/``. Returns the bytes freed.

        Raises:
            StoreError: a file could not be removed.
        """
        trajectory, output = attempt_dir / "trajectory.json", attempt_dir / "output"
        freed = _tree_bytes(trajectory) + _tree_bytes(output)
        try:
            trajectory.unlink(missing_ok=True)
            if output.is_dir() and not output.is_symlink():
                shutil.rmtree(output)
            else:
                output.unlink(missing_ok=True)
        except OSError as exc:
            raise StoreError(
                f"cannot remove {self._name(attempt_dir)}'s artifacts: {exc}; check PBE_ARTIFACT_ROOT is writable"
            ) from exc
        return freed
