"""The sandbox interface: start a box, move files in and out, run a command in it, stop it, reap orphans.

A sandbox has one use (``SandboxSpec.purpose``) and is destroyed after it; it is never handed to another task.

- A **session** sandbox runs a kernel gateway: ``start`` returns once it answers, and
  ``executor.kernel.KernelClient`` talks to it (``SandboxHandle.url`` and ``token``), whatever the backend.
- A **grading** sandbox runs nothing of its own and has no network at all: the grader puts the checker and the
  session's files in (``put_tree``, owned by root where the backend can), ``exec``s the checker and reads its
  answer from the bounded output (``services.sandbox.grading``).

``exec`` runs one command in either (as the sandbox user, with the sandbox's limits, its output bounded and its time
limited). What hardens a box (user, capabilities, read-only root, size-capped writable places, limits) is written
once per backend, in its ``start``, for both uses.
"""

import bisect
import functools
import io
import tarfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.sandbox.contract import WORKSPACE, SandboxHandle, SandboxPurpose

DEFAULT_MEMORY_MB = 2048
"""A sandbox's memory limit (no swap), unless ``PBE_SANDBOX_MEMORY_MB`` says otherwise."""

DEFAULT_CPUS = 1.0
"""A sandbox's CPU limit, unless ``PBE_SANDBOX_CPUS`` says otherwise."""

DEFAULT_PIDS = 512
"""A sandbox's process and thread limit, unless ``PBE_SANDBOX_PIDS`` says otherwise."""

DEFAULT_READY_TIMEOUT_S = 60.0
"""How long a sandbox's kernel gateway may take to answer, unless ``PBE_SANDBOX_READY_TIMEOUT_S`` says otherwise."""

DEFAULT_MAX_TREE_FILES = 1000
"""The most entries (files, and empty folders) ``get_tree`` hands back from one folder; the rest are dropped."""

DEFAULT_EXEC_TIMEOUT_S = 60.0
"""How long an ``exec``'d command may run before it is killed, unless the caller says otherwise."""

DEFAULT_EXEC_OUTPUT_BYTES = 1024 * 1024
"""The most bytes of an ``exec``'d command's stdout, and of its stderr, that are kept; the rest is read and dropped."""

EXEC_TIMEOUT_STATUS = 137
"""The exit status of a command killed at its time limit (``timeout --signal=KILL``: 128 + 9)."""

EXEC_GRACE_S = 5.0
"""How long past an exec's time limit a backend waits for the command's end (``timeout`` kills it inside the box at
the limit; this only guards against a stream or process that does not end)."""

DEFAULT_MAX_TREE_BYTES = 64 * 1024 * 1024
"""The most bytes of files ``get_tree`` hands back from one folder (never more is held in memory); the rest
are dropped. PyBench's largest recorded output is a few MiB; an executor runs up to 32 sessions in 1 GiB, so a
session's share is small, and ``TREES_AT_ONCE`` bounds how many such folders are held at one time."""

TREES_AT_ONCE = 4
"""How many folders one backend reads at once (``SandboxBackend.collect_tree``): at most this many times
``archive_budget`` of archive and files is held for output collection, however many sessions end together."""


@dataclass(frozen=True)
class SandboxSpec:
    """What a session asks of its sandbox; a worker makes it with ``ExecutorSettings.sandbox_spec``."""

    evaluation_id: str
    task_index: int
    attempt: int
    image: str
    memory_mb: int = DEFAULT_MEMORY_MB
    cpus: float = DEFAULT_CPUS
    pids: int = DEFAULT_PIDS
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S
    workspace_mb: int = 1024
    """Size cap of the writable ``/workspace`` (inputs and outputs); the root filesystem is read-only."""
    tmp_mb: int = 256
    """Size cap of each of the writable ``/tmp`` and home folders."""
    worker: str = ""
    """The executor that started it (``ExecutorSettings.WORKER_ID``), carried as a label so that the same worker,
    started again, removes what its previous life left (``reap(worker=...)``); empty: no such label."""
    background: bool = False
    """Started ahead of any session (the warm pool's): where the backend can, its start yields the CPU to the cells
    of running sessions (which run against a time limit) until a session takes it (``SandboxBackend.promote``)."""
    purpose: SandboxPurpose = "session"
    """``session``: a kernel gateway, the session's name and labels (evaluation, task, attempt). ``grading``: no
    gateway (``start`` returns once the box runs), a grading sandbox's name and labels (``GRADING_LABELS``), and a
    workspace that belongs to root (the sandbox user reads what is put there and writes nothing but ``/tmp``)."""
    network: bool = True
    """False: no network at all, loopback only (a grading's). A session needs its network (the executor reaches
    its gateway through it)."""

    def __post_init__(self) -> None:
        if self.purpose == "session" and not self.network:
            raise ValueError("a session sandbox needs its network: its kernel gateway is reached through it")


@dataclass(frozen=True)
class ExecResult:
    """How a command ``exec``'d in a sandbox ended."""

    exit_code: int
    """Its exit status (``EXEC_TIMEOUT_STATUS`` when killed at its time limit)."""
    stdout: bytes
    """The first ``max_output_bytes`` of what it wrote to stdout."""
    stderr: bytes
    """The first ``max_output_bytes`` of what it wrote to stderr."""
    timed_out: bool = False
    """It was killed at its time limit."""
    truncated: bool = False
    """It wrote more than ``max_output_bytes`` to stdout or stderr; the rest was dropped."""


class BoundedOutput:
    """Collects a command's stdout and stderr, keeping at most ``limit`` bytes of each (the rest is counted and
    dropped), so a command that floods its output costs the caller no more memory than the limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._kept = {1: bytearray(), 2: bytearray()}
        self.truncated = False

    def add(self, stream: int, data: bytes) -> None:
        """Keep what fits of ``data`` from ``stream`` (1 stdout, 2 stderr)."""
        kept = self._kept[stream]
        room = self.limit - len(kept)
        if len(data) > room:
            self.truncated = True
        if room > 0:
            kept.extend(data[:room])

    def result(self, exit_code: int) -> ExecResult:
        """How the command ended: killed at its time limit when its status is ``EXEC_TIMEOUT_STATUS``."""
        timed_out = exit_code == EXEC_TIMEOUT_STATUS
        return ExecResult(exit_code, bytes(self._kept[1]), bytes(self._kept[2]), timed_out, self.truncated)


def check_exec(argv: Sequence[str], timeout_s: float, max_output_bytes: int) -> list[str]:
    """``argv`` checked, and wrapped to be killed at ``timeout_s`` (``timeout --signal=KILL``, coreutils).

    Raises:
        ValueError: an empty ``argv``, a NUL in it, a time limit or an output cap that is not positive.
    """
    if not argv or any("\x00" in part for part in argv):
        raise ValueError("exec needs a command (argv[0]) and arguments without NUL characters")
    if timeout_s <= 0 or max_output_bytes <= 0:
        raise ValueError("exec needs a positive timeout_s and max_output_bytes")
    return ["timeout", "--signal=KILL", f"{timeout_s:g}", *argv]


class SandboxBackend(ABC):
    """A way of running sandboxes. Implementations import their SDK lazily."""

    name: str
    telemetry_scope: str = "process"
    """Whose CPU and memory the per-cell probe measures: ``cgroup`` (the whole sandbox) or ``process`` (the
    kernel process), see ``executor.probe``."""

    _trees = threading.BoundedSemaphore(TREES_AT_ONCE)
    """Shared by every backend of the process: the folders being read now (``collect_tree``)."""

    def collect_tree(self, handle: SandboxHandle, path: str) -> "Tree":
        """``get_tree`` with the default caps, waiting while ``TREES_AT_ONCE`` folders are being read already in
        this process (sessions that end together take turns rather than each holding its output at once).

        Raises:
            SandboxUnavailableError: the sandbox is gone.
        """
        with self._trees:
            return self.get_tree(handle, path)

    def problem(self) -> str | None:
        """Why this backend cannot start sandboxes now (its engine or cluster unreachable, say), in words that
        say what to fix; None when it can. A worker takes no session while there is one. Never raises."""
        return None

    def image_reference(self, image: str) -> str:
        """``image`` with the digest this backend would start it from (``name@sha256:...``) where it can tell,
        for the runs' manifests; else ``image`` itself. Never raises."""
        return image

    @abstractmethod
    def start(self, spec: SandboxSpec) -> SandboxHandle:
        """Start a sandbox and wait until its kernel gateway answers.

        Raises:
            SandboxStartError: the sandbox could not be started or did not become ready in time (it is
                removed before this is raised).
        """

    @abstractmethod
    def put_file(self, handle: SandboxHandle, dest: str, data: bytes) -> None:
        """Write a file into the sandbox at ``dest`` (absolute, e.g. ``/workspace/data/a.csv``).

        Raises:
            SandboxUnavailableError: the sandbox is gone.
        """

    def put_tree(self, handle: SandboxHandle, archive: bytes) -> None:
        """Unpack the tar ``archive`` (relative names, folders before their files) under ``/workspace``. Where the
        backend can (Docker), each member keeps the owner the archive gives it: root's, in a grading sandbox,
        which the sandbox user can read but not change. This default writes its regular files with ``put_file``
        (owned by the sandbox user, empty folders left out).

        Raises:
            SandboxError: a member's name leads out of ``/workspace``.
            SandboxUnavailableError: the sandbox is gone or refused the files.
        """
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r") as tar:
            for member in tar:
                if member.isreg():
                    self.put_file(handle, f"{WORKSPACE}/{member.name.removeprefix('./')}", _read_member(tar, member))

    @abstractmethod
    def get_tree(
        self,
        handle: SandboxHandle,
        path: str,
        *,
        max_files: int = DEFAULT_MAX_TREE_FILES,
        max_bytes: int = DEFAULT_MAX_TREE_BYTES,
    ) -> "Tree":
        """Return the regular files under the sandbox folder ``path``, keyed by path relative to it, and each
        folder under it that holds nothing as ``name/`` with empty content (an empty folder is a result:
        "save the files to a folder ./output/140/"), at most ``max_files`` entries and ``max_bytes`` bytes:
        entries are taken in name order until the next one would pass a cap, and the rest are dropped and
        counted (see ``Tree`` and ``TreeCollector``: every backend keeps the same entries).

        Symbolic links and special files are skipped. A missing folder gives an empty tree.

        Raises:
            SandboxUnavailableError: the sandbox is gone.
        """

    @abstractmethod
    def exec(
        self,
        handle: SandboxHandle,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout_s: float = DEFAULT_EXEC_TIMEOUT_S,
        max_output_bytes: int = DEFAULT_EXEC_OUTPUT_BYTES,
    ) -> ExecResult:
        """Run ``argv`` in the sandbox as its unprivileged user, in ``/workspace``, with the sandbox's limits and
        none of the caller's environment; feed it ``stdin`` (then end of file), kill it after ``timeout_s``, keep
        at most ``max_output_bytes`` of its stdout and of its stderr.

        A command that fails, is killed at its time limit or floods its output is not an error: ``ExecResult``
        says how it ended.

        Raises:
            SandboxUnavailableError: the sandbox is gone (never returned as the command's output).
            ValueError: an empty ``argv``, or a time limit or output cap that is not positive.
        """

    def promote(self, handle: SandboxHandle) -> None:
        """Give a sandbox started in the ``background`` a session's share of the CPU, as a session takes it. Backends
        that start every sandbox alike do nothing.

        Raises:
            SandboxUnavailableError: the sandbox is gone.
        """
        return None

    @abstractmethod
    def stop(self, handle: SandboxHandle) -> None:
        """Destroy the sandbox and everything in it. Best effort: never raises for a sandbox already gone."""

    @abstractmethod
    def reap(
        self,
        evaluation_id: str | None = None,
        older_than_s: float = 0.0,
        *,
        worker: str | None = None,
        purpose: SandboxPurpose = "session",
    ) -> list[str]:
        """Remove leftover sandboxes of this project started for ``purpose`` (sessions: of one evaluation, or all;
        of one ``worker``, or any worker's; gradings carry neither label) created more than ``older_than_s``
        seconds ago, with everything they own; return their names."""


@dataclass(frozen=True)
class Tree:
    """What ``get_tree`` collected from a folder: the entries kept, and how much the folder held."""

    files: dict[str, bytes] = field(default_factory=dict)
    """The entries kept, by relative name: files, and empty folders as ``name/`` with empty content."""
    found_entries: int = 0
    """How many entries (files and empty folders) the folder held, kept or not."""
    found_bytes: int = 0
    """How many bytes its files held, kept or not."""
    first_dropped: str | None = None
    """The first entry, in name order, that was not kept (it and every later one were dropped); None: none."""
    max_files: int = DEFAULT_MAX_TREE_FILES
    max_bytes: int = DEFAULT_MAX_TREE_BYTES
    stopped_after: int | None = None
    """The bytes of the folder's archive read before reading stopped (a file larger than the limits, most often a
    sparse one whose holes an archive spells out as zeros); None: the whole folder was read."""

    @property
    def truncated(self) -> bool:
        return self.first_dropped is not None or self.stopped_after is not None

    def note(self, where: str) -> str | None:
        """A sentence for the trajectory saying what was kept of the folder ``where`` (``./output``) and what
        was dropped; None when nothing was."""
        if self.stopped_after is not None:
            return (
                f"{where} was read for {_size(self.stopped_after)} and no further: it holds more than the limits of "
                f"{self.max_files:,} entries and {_size(self.max_bytes)} (a file that large, or a sparse one); "
                f"{len(self.files):,} entries were collected, and what was not read was neither stored nor graded"
            )
        if self.first_dropped is None:
            return None
        kept_bytes = sum(len(data) for data in self.files.values())
        return (
            f"{where} held {self.found_entries:,} entries ({_size(self.found_bytes)}); only {len(self.files):,} "
            f"({_size(kept_bytes)}) were collected, the first in name order within the limits of "
            f"{self.max_files:,} entries and {_size(self.max_bytes)}: {self.found_entries - len(self.files):,} "
            f"were dropped, from {where}/{self.first_dropped} on, and were neither stored nor graded"
        )


def _size(count: int) -> str:
    if count < 1024 * 1024:
        return f"{count / 1024:.1f} KiB"
    return f"{count / 2**20:.1f} MiB"


class TreeCollector:
    """Gathers a folder's entries, offered in any order (a walk, a tar stream), and keeps those of them that
    come first in name order while they fit ``max_files`` entries and ``max_bytes`` bytes: the same entries
    whatever the order of offering, so every backend hands back the same tree.

    At most ``max_bytes`` of file data is held (plus the file being offered): a file that cannot be kept is
    never read, and one that stops fitting when an earlier name arrives is let go.
    """

    def __init__(self, max_files: int = DEFAULT_MAX_TREE_FILES, max_bytes: int = DEFAULT_MAX_TREE_BYTES) -> None:
        self.max_files = max_files
        self.max_bytes = max_bytes
        self._held: dict[str, bytes] = {}
        self._names: list[str] = []
        """The held names, sorted."""
        self._held_bytes = 0
        self._cut: str | None = None
        """The first name known not to fit: it and every later name are dropped."""
        self._folders: set[str] = set()
        self._occupied: set[str] = set()
        self._files = 0
        self._bytes = 0
        self._stopped_after: int | None = None

    def _occupy(self, name: str) -> None:
        parts = name.split("/")
        for depth in range(1, len(parts)):
            self._occupied.add("/".join(parts[:depth]))

    def _drop_from(self, name: str) -> None:
        """Let go of ``name`` and every later held name."""
        self._cut = name if self._cut is None else min(self._cut, name)
        while self._names and self._names[-1] >= self._cut:
            self._held_bytes -= len(self._held.pop(self._names.pop()))

    def add_file(self, name: str, size: int, read: Callable[[], bytes]) -> None:
        """Offer the regular file ``name`` (relative, ``/``-separated) of ``size`` bytes; ``read`` is called
        only if it may be kept (it may return more or fewer bytes than ``size``: what it returns counts)."""
        self._files += 1
        self._bytes += size
        self._occupy(name)
        if self._cut is not None and name >= self._cut:
            return
        later = bool(self._names) and name > self._names[-1]
        if size > self.max_bytes or (
            later and (len(self._names) >= self.max_files or self._held_bytes + size > self.max_bytes)
        ):
            self._drop_from(name)
            return
        data = read()
        self._held[name] = data
        bisect.insort(self._names, name)
        self._held_bytes += len(data)
        while len(self._names) > self.max_files or self._held_bytes > self.max_bytes:
            self._drop_from(self._names[-1])

    def stop(self, read_bytes: int) -> None:
        """Reading stopped after ``read_bytes`` of the archive: the tree keeps what it holds and says so."""
        self._stopped_after = read_bytes

    def add_folder(self, name: str) -> None:
        """Offer the folder ``name`` (relative; ``""`` and ``.`` are the folder itself and ignored)."""
        name = name.strip("/")
        if name in ("", "."):
            return
        self._folders.add(name)
        self._occupy(name)

    def tree(self) -> Tree:
        """The entries kept: the held files and the empty folders, in name order, while they fit the caps."""
        empty = [folder + "/" for folder in self._folders if folder not in self._occupied]
        cut = self._cut
        kept: dict[str, bytes] = {}
        total = 0
        for name in sorted([*self._names, *empty]):
            if cut is not None and name >= cut:
                break
            data = self._held.get(name, b"")
            if len(kept) >= self.max_files or total + len(data) > self.max_bytes:
                cut = name
                break
            kept[name] = data
            total += len(data)
        return Tree(
            files=kept,
            found_entries=self._files + len(empty),
            found_bytes=self._bytes,
            first_dropped=cut,
            max_files=self.max_files,
            max_bytes=self.max_bytes,
            stopped_after=self._stopped_after,
        )


def one_file_archive(relative: list[str], data: bytes, uid: int) -> bytes:
    """A tar holding the file ``relative`` (path parts under the folder it is unpacked in) with its folders first,
    all owned by ``uid`` (the sandbox user): how ``put_file`` sends a file into a container or a pod."""
    buffer = io.BytesIO()
    now = int(time.time())
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for depth in range(1, len(relative)):
            folder = tarfile.TarInfo("/".join(relative[:depth]))
            folder.type, folder.mode, folder.mtime = tarfile.DIRTYPE, 0o755, now
            folder.uid = folder.gid = uid
            tar.addfile(folder)
        info = tarfile.TarInfo("/".join(relative))
        info.size, info.mode, info.mtime = len(data), 0o644, now
        info.uid = info.gid = uid
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class ReadBudgetError(Exception):
    """A stream was read as far as its reader's ``limit``: the rest is not read."""


def archive_budget(max_files: int, max_bytes: int) -> int:
    """How many bytes of a folder's tar archive are read at most: the kept files' bytes, a header and padding per
    entry, and room for the entries dropped on the way; past it the archive is not read on (``ReadBudgetError``)."""
    return 2 * max_bytes + 4 * 1024 * max_files + 64 * 2**20


class ChunkReader(io.RawIOBase):
    """A readable file over an iterable of byte chunks (the engine's archive stream, a pod's exec output), so a tar
    archive is read as it arrives; ``total`` counts the bytes read so far. Past ``limit`` bytes a read raises
    ``ReadBudgetError`` instead of reading on."""

    def __init__(self, chunks: Iterable[bytes], limit: int | None = None) -> None:
        self._chunks = iter(chunks)
        self._pending = memoryview(b"")
        self.total = 0
        self.limit = limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.limit is not None and self.total >= self.limit:
            raise ReadBudgetError(f"read {self.total:,} bytes, the limit")
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._pending = memoryview(chunk)
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        self.total += size
        return size


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    extracted = tar.extractfile(member)
    return extracted.read() if extracted is not None else b""


def collect_tar(reader: ChunkReader, collector: TreeCollector, relative_name: Callable[[str], str]) -> None:
    """Offer the folders and regular files of the tar stream ``reader`` to ``collector``, named by
    ``relative_name(member name)``; a file's content is read only if the collector keeps it (the rest of the stream
    is read through, never held).

    A stream longer than ``reader.limit`` stops there: what was collected so far stays, and the collector is told
    (``TreeCollector.stop``), so a sparse file of a terabyte costs the read of the budget, not of the terabyte.

    Raises:
        tarfile.TarError: the stream is not a tar archive, or breaks off.
        OSError: reading the stream failed.
    """
    try:
        with tarfile.open(fileobj=reader, mode="r|") as tar:
            for member in tar:
                relative = relative_name(member.name)
                if member.isdir():
                    collector.add_folder(relative)
                elif member.isreg() and relative:
                    collector.add_file(relative, member.size, functools.partial(_read_member, tar, member))
    except ReadBudgetError:
        collector.stop(reader.total)
