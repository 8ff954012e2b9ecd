"""A whole evaluation as one ``.tar.gz``, streamed file by file, so that an export takes one request instead of
one per task and file (the per-key rate limit would stop a file-by-file export of a full suite)::

    <evaluation>/evaluation.json
    <evaluation>/results.json
    <evaluation>/tasks/<task>/trajectory.json       the task's latest attempt that has one
    <evaluation>/tasks/<task>/output/<name>          what that attempt saved under ./output
    <evaluation>/tasks/<task>/output/<folder>/       a folder it left empty

The archive is made while it is sent: memory holds one file at a time, whatever the evaluation's size. Names come
from the artifact store, which refuses names that leave an attempt's folder; symbolic links are never followed.
"""

import io
import tarfile
import time
from collections.abc import Iterable, Iterator

from gateway.readmodel import output_files
from services.evaluation import Evaluation
from services.store import ArtifactStore
from services.verdict import Results

ARCHIVE_MEDIA_TYPE = "application/gzip"


class _Spool(io.RawIOBase):
    """A write-only file whose bytes are taken out as they come, for ``tarfile`` in stream mode."""

    def __init__(self) -> None:
        super().__init__()
        self._chunks: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self._chunks.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data, self._chunks = b"".join(self._chunks), []
        return data


def _member(name: str, size: int, *, folder: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = 0 if folder else size
    info.type = tarfile.DIRTYPE if folder else tarfile.REGTYPE
    info.mode = 0o755 if folder else 0o644
    info.mtime = int(time.time())
    return info


def stream_archive(
    store: ArtifactStore, evaluation: Evaluation, results: Results, attempts: Iterable[tuple[int, int]]
) -> Iterator[bytes]:
    """Yield the ``.tar.gz`` of an evaluation in chunks.

    ``results``: its results document; ``attempts``: (task, attempt) pairs whose trajectory and saved files go in
    (a task without a stored trajectory is left out).

    Raises:
        StoreError: the evaluation id is not a valid one.
        ArtifactExpiredError: retention removed an attempt's files while the archive was being sent.
    """
    root = store.evaluation_dir(evaluation.id).name
    documents = {
        "evaluation.json": evaluation.model_dump_json(indent=1).encode(),
        "results.json": results.model_dump_json(indent=1).encode(),
    }
    spool = _Spool()
    with tarfile.open(fileobj=spool, mode="w|gz") as archive:
        for name, data in documents.items():
            archive.addfile(_member(f"{root}/{name}", len(data)), io.BytesIO(data))
            yield spool.take()
        for task, attempt in attempts:
            trajectory = store.trajectory_path(evaluation.id, task, attempt)
            if not trajectory.is_file():
                continue
            prefix = f"{root}/tasks/{task}"
            archive.add(trajectory, arcname=f"{prefix}/trajectory.json", recursive=False)
            yield spool.take()
            for saved in output_files(store, evaluation.id, task, attempt):
                if saved.path is None:
                    archive.addfile(_member(f"{prefix}/output/{saved.name}", 0, folder=True))
                    continue
                with saved.path.open("rb") as handle:
                    archive.addfile(_member(f"{prefix}/output/{saved.name}", saved.path.stat().st_size), handle)
                yield spool.take()
    yield spool.take()
