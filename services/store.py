"""The artifact store: a directory laid out so a finished evaluation can be read without the service.

::

    <root>/evaluations/<evaluation>/evaluation.json
    <root>/evaluations/<evaluation>/results.json
    <root>/evaluations/<evaluation>/tasks/<task>/attempt-<n>/trajectory.json
    <root>/evaluations/<evaluation>/tasks/<task>/attempt-<n>/output/...      files the session produced
    <root>/evaluations/<evaluation>/tasks/<task>/attempt-<n>/verdict.json

Every write is atomic (a temporary file renamed into place), so a reader never sees half a file and a
repeated write of the same (evaluation, task, attempt) replaces rather than duplicates.
"""

import os
import re
import tempfile
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from services.errors import ArtifactNotFoundError, StoreError
from services.evaluation import Evaluation
from services.trajectory import Trajectory
from services.verdict import Results, Verdict

_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
ModelT = TypeVar("ModelT", bound=BaseModel)


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
        return self._read(self.attempt_dir(evaluation_id, task_index, attempt) / "trajectory.json", Trajectory)

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
        """Return the produced files as ``./output/...`` names, and empty folders as ``./output/.../``, sorted."""
        base = self.output_dir(evaluation_id, task_index, attempt)
        if not base.is_dir():
            return []
        return sorted(
            "./output/" + p.relative_to(base).as_posix() + ("/" if p.is_dir() else "")
            for p in base.rglob("*")
            if not p.name.startswith(".")
            and not p.is_symlink()
            and (p.is_file() or (p.is_dir() and not any(p.iterdir())))
        )

    def put_verdict(self, verdict: Verdict) -> None:
        path = self.attempt_dir(verdict.evaluation_id, verdict.task_index, verdict.attempt) / "verdict.json"
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

    def put_results(self, results: Results) -> None:
        self._write(
            self.evaluation_dir(results.evaluation_id) / "results.json", results.model_dump_json(indent=1).encode()
        )
