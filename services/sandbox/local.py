"""The local backend: a kernel gateway as a subprocess of the executor, for development without Docker.

**It does not isolate.** The agent's code runs as the executor's own user, on the host, with the host's
network: it can read and write whatever that user can (other sandboxes' folders, the user's files), see
other processes and, through ``/proc``, their environments (its own gateway's token, the executor's
variables), and open any connection. Never run a model you do not trust with it; use the docker backend.

What it does give each sandbox:

* a fresh folder ``<root>/pbe-local-XXXXXXXX/`` (``root``: ``PBE_SANDBOX_LOCAL_ROOT``, else the system's
  temporary folder), laid out as::

      meta/sandbox.json   name, labels, gateway pid, creation time (what ``reap`` reads); not in the workspace
      meta/gateway.log    the gateway's (and its kernels') stdout and stderr
      workspace/          the sandbox's ``/workspace``: the kernel's working directory, with data/ and output/
      home/               HOME of the gateway and its kernels
      runtime/            JUPYTER_RUNTIME_DIR (kernel connection files)

* ``jupyter kernelgateway`` (``python -m kernel_gateway`` of the executor's own Python) on 127.0.0.1 and a
  free port, with a token of its own, started with the sandbox image's gateway configuration
  (``services/sandbox/image/jupyter_kernel_gateway_config.py``: TCP_NODELAY, the kernels' environment allowlist),
  its address given on the command line (which wins over the file);
* an environment of a few variables (PATH, HOME, LANG, MPLBACKEND, PYTHONUNBUFFERED, JUPYTER_RUNTIME_DIR and
  its token), never the executor's; kernels get PATH and the allowlisted ones of these, not the token;
* sandbox paths: ``put_file`` and ``get_tree`` take paths under ``/workspace`` and never follow a symbolic
  link (every folder is opened relative to its parent with ``O_NOFOLLOW``);
* ``stop`` and ``reap`` kill the gateway's process group, then every process whose HOME is the sandbox's
  home or whose working directory is in its folder, and remove the folder.

The handle's ``sandbox_id`` is ``"<gateway pid>:<absolute path of the sandbox folder>"``: any process on the
same host can re-attach (``put_file``, ``get_tree``) or clean up with it; the folder's ``meta/sandbox.json``
must name the same sandbox, so a forged id never makes ``stop`` remove anything else.

Known gaps (what the docker backend has and this one does not):

* isolation: no separate user, filesystem, process or network namespace (above);
* limits: ``memory_mb``, ``cpus``, ``pids``, ``workspace_mb`` and ``tmp_mb`` of the spec are ignored
  (``RLIMIT_AS`` breaks numpy's and OpenBLAS's address-space reservations; the others need cgroups);
* image: ``spec.image`` is ignored: kernels run in the executor's Python, with whatever packages it has;
* clean-up: a process that the code detaches (a new session) and that leaves the sandbox's folder and HOME
  outlives ``stop``.
"""

import contextlib
import errno
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil

from services.errors import SandboxError, SandboxStartError, SandboxUnavailableError
from services.sandbox.base import (
    DEFAULT_EXEC_OUTPUT_BYTES,
    DEFAULT_EXEC_TIMEOUT_S,
    DEFAULT_MAX_TREE_BYTES,
    DEFAULT_MAX_TREE_FILES,
    EXEC_GRACE_S,
    EXEC_TIMEOUT_STATUS,
    BoundedOutput,
    ExecResult,
    SandboxBackend,
    SandboxSpec,
    Tree,
    TreeCollector,
    check_exec,
)
from services.sandbox.contract import (
    GRADING_LABELS,
    PURPOSE_ROLES,
    ROLE_LABEL,
    SANDBOX_ROLE,
    WORKSPACE,
    SandboxHandle,
    SandboxPurpose,
    grading_name,
    reap_selector,
    sandbox_labels,
    sandbox_name,
)

SANDBOX_DIR_PREFIX = "pbe-local-"
"""Every local sandbox's folder under the root starts with this, so ``reap`` finds them all."""

DEFAULT_CONFIG_FILE = Path(__file__).resolve().parent / "image" / "jupyter_kernel_gateway_config.py"
"""The gateway configuration of the sandbox image, reused as is."""

DEFAULT_GATEWAY_COMMAND = (sys.executable, "-m", "kernel_gateway")
"""How the gateway is started: the executor's own Python (jupyter_kernel_gateway and ipykernel are dev extras)."""

DEFAULT_STOP_GRACE_S = 5.0
"""How long ``stop`` lets the gateway shut its kernels down after SIGTERM before everything gets SIGKILL."""

_LOG_TAIL_CHARS = 2000
_CONFIG_FAILED = b"Exception while loading config file"
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_CHILDREN: dict[int, "subprocess.Popen[bytes]"] = {}
"""Gateways started by this process, by pid, so that whichever backend instance stops one also reaps it."""
_CHILDREN_LOCK = threading.Lock()


@dataclass(frozen=True)
class _Layout:
    """The folders and files of one sandbox."""

    folder: Path

    @property
    def meta(self) -> Path:
        return self.folder / "meta"

    @property
    def meta_file(self) -> Path:
        return self.meta / "sandbox.json"

    @property
    def log(self) -> Path:
        return self.meta / "gateway.log"

    @property
    def workspace(self) -> Path:
        return self.folder / "workspace"

    @property
    def home(self) -> Path:
        return self.folder / "home"

    @property
    def runtime(self) -> Path:
        return self.folder / "runtime"


class LocalSandboxBackend(SandboxBackend):
    """Sandboxes as kernel gateway subprocesses on this host, without isolation (see the module docstring)."""

    name = "local"
    telemetry_scope = "process"
    """The kernel process only: the cgroup a local kernel is in is the executor's (or the host's), not its own."""

    def __init__(
        self,
        root: str | Path | None = None,
        *,
        gateway_command: Sequence[str] = DEFAULT_GATEWAY_COMMAND,
        config_file: Path | None = DEFAULT_CONFIG_FILE,
        stop_grace_s: float = DEFAULT_STOP_GRACE_S,
    ) -> None:
        """``root``: where sandbox folders are made (default: the system's temporary folder);
        ``gateway_command``: the program and arguments that run the gateway (the address, port and config
        flags are appended); ``config_file``: the gateway configuration (``None``: the gateway's defaults)."""
        self.root = Path(root if root is not None else tempfile.gettempdir()).resolve()
        self.gateway_command = list(gateway_command)
        self.config_file = config_file
        self.stop_grace_s = stop_grace_s

    def start(self, spec: SandboxSpec) -> SandboxHandle:
        """Make a sandbox folder and start its kernel gateway; wait until ``GET /api`` answers.

        Raises:
            SandboxStartError: the folder could not be made, or the gateway exited, did not answer within
                ``spec.ready_timeout_s`` or could not load its configuration file (its log's end is in the
                message); the processes and the folder are removed before this is raised.
        """
        token = secrets.token_urlsafe(24)
        if spec.purpose == "session":
            name = sandbox_name(spec.evaluation_id, spec.task_index, spec.attempt)
            labels = sandbox_labels(spec.evaluation_id, spec.task_index, spec.attempt, spec.worker)
        else:  # the reference runs a gateway for every purpose: it isolates nothing, a grading's or a session's
            name, labels = grading_name(), dict(GRADING_LABELS)
        _prune_children()
        if self.config_file is not None and not self.config_file.is_file():
            raise SandboxStartError(
                f"the kernel gateway configuration {self.config_file} is missing: is the repository complete?"
            )
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            layout = _Layout(Path(tempfile.mkdtemp(prefix=SANDBOX_DIR_PREFIX, dir=self.root)))
        except OSError as exc:
            raise SandboxStartError(
                f"cannot make a sandbox folder under {self.root}: {exc}; "
                "set PBE_SANDBOX_LOCAL_ROOT to a writable folder"
            ) from exc
        created = time.time()
        process: subprocess.Popen[bytes] | None = None
        try:
            for folder in (layout.meta, layout.workspace / "data", layout.workspace / "output", layout.home):
                folder.mkdir(parents=True)
            layout.runtime.mkdir(mode=0o700)
            _write_meta(layout, name=name, labels=labels, pid=None, created=created)
            port = _free_port()
            config = [f"--config={self.config_file}"] if self.config_file is not None else []
            command = [
                *self.gateway_command,
                *config,
                "--KernelGatewayApp.ip=127.0.0.1",
                f"--KernelGatewayApp.port={port}",
                "--KernelGatewayApp.port_retries=0",
            ]
            with open(layout.log, "wb") as log:
                process = subprocess.Popen(
                    command,
                    cwd=layout.workspace,
                    env=_gateway_env(layout, token),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            with _CHILDREN_LOCK:
                _CHILDREN[process.pid] = process
            _write_meta(layout, name=name, labels=labels, pid=process.pid, created=created)
            handle = SandboxHandle(
                backend=self.name,
                sandbox_id=f"{process.pid}:{layout.folder}",
                name=name,
                url=f"http://127.0.0.1:{port}",
                token=token,
                image="local",
                created_at=datetime.fromtimestamp(created, UTC),
                labels=labels,
            )
            self._wait_ready(process, handle, layout, spec.ready_timeout_s)
        except OSError as exc:
            self._destroy(layout, process.pid if process is not None else None)
            raise SandboxStartError(f"cannot start a local sandbox: {exc}") from exc
        except BaseException:
            self._destroy(layout, process.pid if process is not None else None)
            raise
        return handle

    def _wait_ready(
        self, process: "subprocess.Popen[bytes]", handle: SandboxHandle, layout: _Layout, timeout_s: float
    ) -> None:
        deadline = time.monotonic() + timeout_s
        last_error = "no answer"
        with httpx.Client(timeout=2.0) as http:
            while True:
                status = process.poll()
                if status is not None:
                    raise SandboxStartError(
                        f"sandbox {handle.name}'s kernel gateway exited with status {status} while starting; "
                        f"is jupyter_kernel_gateway installed (pip install -e '.[dev]')? Its log ends:\n"
                        f"{_tail(layout.log)}"
                    )
                try:
                    response = http.get(f"{handle.url}/api", headers={"Authorization": f"token {handle.token}"})
                    if response.status_code == 200:
                        _check_config_loaded(handle, layout)
                        return
                    last_error = f"HTTP {response.status_code}"
                except httpx.HTTPError as exc:
                    last_error = str(exc) or type(exc).__name__
                if time.monotonic() >= deadline:
                    raise SandboxStartError(
                        f"sandbox {handle.name}'s kernel gateway did not answer within {timeout_s:.0f} s "
                        f"({last_error}); raise PBE_SANDBOX_READY_TIMEOUT_S if the host is busy. Its log ends:\n"
                        f"{_tail(layout.log)}"
                    )
                time.sleep(0.05)

    def _layout(self, handle: SandboxHandle) -> _Layout:
        """The folders of a live sandbox.

        Raises:
            SandboxUnavailableError: the sandbox's folder is gone (or never was this sandbox's).
        """
        layout = _layout_of(handle.sandbox_id)
        meta = _read_meta(layout) if layout is not None else None
        if layout is None or meta is None or meta.get("name") != handle.name:
            raise SandboxUnavailableError(f"sandbox {handle.name} is gone (stopped or reaped)")
        return layout

    def exec(
        self,
        handle: SandboxHandle,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout_s: float = DEFAULT_EXEC_TIMEOUT_S,
        max_output_bytes: int = DEFAULT_EXEC_OUTPUT_BYTES,
    ) -> ExecResult:
        """A child process in the sandbox's workspace with the gateway's environment less its token, killed by
        ``timeout`` (and its process group after a grace period); both pipes read by threads into the caps.

        Raises:
            SandboxUnavailableError: the sandbox's folder is gone.
            ValueError: a bad ``argv``, ``timeout_s`` or ``max_output_bytes``.
        """
        command = check_exec(argv, timeout_s, max_output_bytes)
        layout = self._layout(handle)
        env = {k: v for k, v in _gateway_env(layout, "").items() if k != "KG_AUTH_TOKEN"}
        process = subprocess.Popen(
            command,
            cwd=layout.workspace,
            env=env,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        output = BoundedOutput(max_output_bytes)
        readers = [
            threading.Thread(target=_drain, args=(pipe, stream, output), daemon=True)
            for stream, pipe in ((1, process.stdout), (2, process.stderr))
        ]
        for reader in readers:
            reader.start()
        if stdin is not None and process.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                process.stdin.write(stdin)
            process.stdin.close()
        try:
            code = process.wait(timeout=timeout_s + EXEC_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            code = process.wait()
        for reader in readers:
            reader.join(timeout=EXEC_GRACE_S)
        code = EXEC_TIMEOUT_STATUS if code == -signal.SIGKILL else code
        return output.result(code)

    def put_file(self, handle: SandboxHandle, dest: str, data: bytes) -> None:
        """Write ``data`` to the sandbox path ``dest`` (``/workspace/...``), making its folders.

        Raises:
            SandboxError: ``dest`` is not a file under ``/workspace``, climbs out with ``..``, is a symbolic
                link or goes through one or through a file where a folder should be (a caller's mistake, or the
                sandbox's doing: the closest error there is; the docker backend has no other writable place).
            SandboxUnavailableError: the sandbox is gone, or the file could not be written.
        """
        layout = self._layout(handle)
        parts = _workspace_parts(dest)
        if not parts:
            raise SandboxError(f"put_file needs a file path under {WORKSPACE}/, like {WORKSPACE}/data/x.csv")
        try:
            folder_fd = _open_folder(layout.workspace, parts[:-1], create=True)
            if folder_fd is None:
                raise SandboxError(
                    f"cannot write {dest} into sandbox {handle.name}: a folder on the way is a symbolic link or a "
                    "file (links are never followed)"
                )
            try:
                fd = os.open(
                    parts[-1],
                    os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK,
                    0o644,
                    dir_fd=folder_fd,
                )
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
                raise SandboxError(
                    f"cannot write {dest} into sandbox {handle.name}: it is a symbolic link (links are never followed)"
                ) from exc
            finally:
                os.close(folder_fd)
            with os.fdopen(fd, "wb") as file:
                file.write(data)
        except OSError as exc:
            self._layout(handle)  # gone meanwhile: say so
            raise SandboxUnavailableError(f"cannot write {dest} into sandbox {handle.name}: {exc}") from exc

    def get_tree(
        self,
        handle: SandboxHandle,
        path: str,
        *,
        max_files: int = DEFAULT_MAX_TREE_FILES,
        max_bytes: int = DEFAULT_MAX_TREE_BYTES,
    ) -> Tree:
        """Return the regular files under the sandbox folder ``path`` (``/workspace/...``), keyed by path
        relative to it with ``/``, and each folder that holds nothing as ``name/`` (empty content), within
        ``max_files`` entries and ``max_bytes`` bytes (``TreeCollector``: a file that is not kept is not read).
        Symbolic links (to files or folders) and special files are skipped; a missing folder, or one reached
        through a link, gives an empty tree.

        Raises:
            SandboxError: ``path`` is not under ``/workspace`` or climbs out with ``..``.
            SandboxUnavailableError: the sandbox is gone.
        """
        layout = self._layout(handle)
        parts = _workspace_parts(path)
        collector = TreeCollector(max_files, max_bytes)
        try:
            top_fd = _open_folder(layout.workspace, parts, create=False)
            if top_fd is None:
                return Tree(max_files=max_files, max_bytes=max_bytes)
            try:
                for folder, _dirs, names, folder_fd in os.fwalk(".", dir_fd=top_fd, follow_symlinks=False):
                    collector.add_folder(os.path.normpath(folder).replace(os.sep, "/"))
                    for name in names:
                        relative = os.path.normpath(os.path.join(folder, name)).replace(os.sep, "/")
                        _offer_regular(collector, relative, name, folder_fd, max_bytes)
            finally:
                os.close(top_fd)
        except OSError as exc:
            self._layout(handle)  # gone meanwhile: say so
            raise SandboxUnavailableError(f"cannot read {path} from sandbox {handle.name}: {exc}") from exc
        return collector.tree()

    def stop(self, handle: SandboxHandle) -> None:
        """Kill the sandbox's processes and remove its folder. Never raises for a sandbox already gone."""
        layout = _layout_of(handle.sandbox_id)
        meta = _read_meta(layout) if layout is not None else None
        if layout is None or meta is None or meta.get("name") != handle.name:
            return
        pid, _, _ = handle.sandbox_id.partition(":")
        self._destroy(layout, int(pid))

    def reap(
        self,
        evaluation_id: str | None = None,
        older_than_s: float = 0.0,
        *,
        worker: str | None = None,
        purpose: SandboxPurpose = "session",
    ) -> list[str]:
        """Remove the sandboxes under this backend's root (of one evaluation, or all; of one worker, or any's)
        made more than ``older_than_s`` seconds ago, killing their processes; return their names. Never raises."""
        cutoff = time.time() - older_than_s
        removed = []
        try:
            folders = sorted(self.root.glob(f"{SANDBOX_DIR_PREFIX}*"))
        except OSError:
            return []
        for folder in folders:
            layout = _Layout(folder)
            meta = _read_meta(layout)
            if meta is None or folder.is_symlink():
                continue
            labels = meta.get("labels")
            role = labels.get(ROLE_LABEL, SANDBOX_ROLE) if isinstance(labels, dict) else SANDBOX_ROLE
            if role != PURPOSE_ROLES[purpose]:
                continue
            wanted = reap_selector(evaluation_id, worker)
            if wanted and (not isinstance(labels, dict) or any(labels.get(k) != v for k, v in wanted.items())):
                continue
            created = meta.get("created")
            if not isinstance(created, int | float) or created > cutoff:
                continue
            pid = meta.get("pid")
            self._destroy(layout, pid if isinstance(pid, int) else None)
            removed.append(str(meta.get("name", folder.name)))
        return removed

    def _destroy(self, layout: _Layout, pid: int | None) -> None:
        """Kill every process of the sandbox, then remove its folder (its metadata last). Best effort."""
        with contextlib.suppress(OSError, psutil.Error):
            _kill_processes(layout, pid, self.stop_grace_s)
        with _CHILDREN_LOCK:
            child = _CHILDREN.pop(pid, None) if pid is not None else None
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=1)
        with contextlib.suppress(OSError):
            for entry in layout.folder.iterdir():
                if entry.name != "meta":
                    _remove(entry)
        _remove(layout.meta)
        with contextlib.suppress(OSError):
            layout.folder.rmdir()


def _prune_children() -> None:
    """Collect the exit status of gateways that ended without this process stopping them (reaped by another
    process), so they do not stay zombies of a long-lived executor."""
    with _CHILDREN_LOCK:
        for pid, child in list(_CHILDREN.items()):
            if child.poll() is not None:
                del _CHILDREN[pid]


def _layout_of(sandbox_id: str) -> _Layout | None:
    """The layout named by a ``"<pid>:<folder>"`` id, or None if the id is not one of this backend's."""
    pid, _, folder = sandbox_id.partition(":")
    path = Path(folder)
    if not pid.isdigit() or not path.is_absolute() or not path.name.startswith(SANDBOX_DIR_PREFIX):
        return None
    return _Layout(path)


def _read_meta(layout: _Layout) -> dict[str, Any] | None:
    try:
        meta = json.loads(layout.meta_file.read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _write_meta(layout: _Layout, *, name: str, labels: dict[str, str], pid: int | None, created: float) -> None:
    meta = {
        "name": name,
        "labels": labels,
        "pid": pid,
        "created": created,
        "created_at": datetime.fromtimestamp(created, UTC).isoformat(),
    }
    partial = layout.meta / "sandbox.json.partial"
    partial.write_text(json.dumps(meta, indent=2))
    os.replace(partial, layout.meta_file)


def _gateway_env(layout: _Layout, token: str) -> dict[str, str]:
    """The gateway's whole environment: a few variables of its own, nothing of the executor's but PATH and LANG."""
    path = os.environ.get("PATH", os.defpath)
    python_bin = os.path.dirname(sys.executable)
    if python_bin not in path.split(os.pathsep):
        path = python_bin + os.pathsep + path
    return {
        "PATH": path,
        "HOME": str(layout.home),
        "LANG": os.environ.get("LANG") or "C.UTF-8",
        "MPLBACKEND": "Agg",
        "PYTHONUNBUFFERED": "1",
        "JUPYTER_RUNTIME_DIR": str(layout.runtime),
        "KG_AUTH_TOKEN": token,
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _check_config_loaded(handle: SandboxHandle, layout: _Layout) -> None:
    """Traitlets logs a configuration file that fails and goes on without it (no TCP_NODELAY, no allowlist).

    Raises:
        SandboxStartError: the gateway's log says its configuration file failed to load.
    """
    try:
        failed = _CONFIG_FAILED in layout.log.read_bytes()
    except OSError:
        return
    if failed:
        raise SandboxStartError(
            f"sandbox {handle.name}'s kernel gateway could not load its configuration file; fix it. Its log ends:\n"
            f"{_tail(layout.log)}"
        )


def _tail(log: Path) -> str:
    try:
        with open(log, "rb") as file:
            file.seek(0, os.SEEK_END)
            file.seek(max(0, file.tell() - _LOG_TAIL_CHARS))
            return file.read().decode(errors="replace").strip() or "(empty)"
    except OSError as exc:
        return f"(unreadable: {exc})"


def _workspace_parts(path: str) -> list[str]:
    """The parts of a sandbox path below ``/workspace`` (``/workspace/data/x.csv`` -> ``["data", "x.csv"]``).

    Raises:
        SandboxError: the path is not under ``/workspace``, climbs with ``..`` or holds a NUL character.
    """
    if "\0" in path:
        raise SandboxError(f"sandbox path {path!r} holds a NUL character: give a plain path under {WORKSPACE}/")
    if path != WORKSPACE and not path.startswith(WORKSPACE + "/"):
        raise SandboxError(
            f"sandbox path {path!r} is outside {WORKSPACE}: the local backend has only {WORKSPACE}/...; "
            f"use a path like {WORKSPACE}/data/x.csv"
        )
    parts = [part for part in path[len(WORKSPACE) :].split("/") if part not in ("", ".")]
    if ".." in parts:
        raise SandboxError(f"sandbox path {path!r} climbs with '..': give a plain path under {WORKSPACE}/")
    return parts


def _open_folder(workspace: Path, parts: list[str], *, create: bool) -> int | None:
    """Open ``workspace/parts...`` one folder at a time, each relative to its parent and never through a link.

    Returns:
        The folder's descriptor (the caller closes it), or None when a part is a link, a file, or missing
        (and ``create`` is false).

    Raises:
        OSError: the workspace itself is gone or is a link, or a folder could not be made.
    """
    fd = os.open(workspace, _FOLDER_FLAGS)
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            try:
                child = os.open(part, _FOLDER_FLAGS, dir_fd=fd)
            except (FileNotFoundError, NotADirectoryError):
                os.close(fd)
                return None
            except OSError as exc:
                if exc.errno != errno.ELOOP:  # ELOOP: a symbolic link
                    raise
                os.close(fd)
                return None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _offer_regular(collector: TreeCollector, relative: str, name: str, folder_fd: int, max_bytes: int) -> None:
    """Offer the file ``name`` of the folder to ``collector`` if it is a regular file (links, special files and
    files gone meanwhile are skipped); it is read, at most ``max_bytes + 1`` bytes, only if it may be kept."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder_fd)
    except OSError:  # a link (ELOOP), a FIFO without writer, gone meanwhile
        return
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode):
            collector.add_file(relative, info.st_size, lambda: file.read(max_bytes + 1))


def _remove(path: Path) -> None:
    """Remove a file or a folder tree, making folders writable where the sandbox's code made them not."""

    def retry(function: Any, failed: str, _error: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(failed), 0o700)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, 0o700)
            function(failed)

    if path.is_symlink() or not path.is_dir():
        with contextlib.suppress(OSError):
            path.unlink()
        return
    shutil.rmtree(path, onerror=retry)


def _belongs(process: psutil.Process, layout: _Layout) -> bool:
    """Whether a process is the sandbox's: its HOME is the sandbox's home or it works inside its folder."""
    try:
        if process.environ().get("HOME") == str(layout.home):
            return True
        cwd = process.cwd()
    except (psutil.Error, OSError):
        return False
    folder = str(layout.folder)
    return bool(cwd == folder or cwd.startswith(folder + os.sep))


def _sandbox_processes(layout: _Layout) -> list[psutil.Process]:
    spared = {os.getpid(), *(parent.pid for parent in psutil.Process().parents())}
    return [process for process in psutil.process_iter() if process.pid not in spared and _belongs(process, layout)]


def _kill_processes(layout: _Layout, pid: int | None, grace_s: float) -> None:
    """SIGTERM the gateway's process group (it shuts its kernels down), wait up to ``grace_s``, then SIGKILL
    every process left that belongs to the sandbox, with the process groups they lead."""
    victims: dict[int, psutil.Process] = {}
    gateway: psutil.Process | None = None
    if pid is not None:
        with contextlib.suppress(psutil.Error, OSError):
            candidate = psutil.Process(pid)
            if _belongs(candidate, layout):
                gateway = candidate
                victims.update({child.pid: child for child in candidate.children(recursive=True)})
    if gateway is not None:
        with contextlib.suppress(OSError):
            if os.getpgid(gateway.pid) == gateway.pid:
                os.killpg(gateway.pid, signal.SIGTERM)
            else:
                gateway.terminate()
        with _CHILDREN_LOCK:
            child = _CHILDREN.get(gateway.pid)
        with contextlib.suppress(psutil.TimeoutExpired, subprocess.TimeoutExpired, psutil.Error):
            if child is not None:
                child.wait(timeout=grace_s)
            else:
                gateway.wait(timeout=grace_s)
    for _ in range(3):
        victims.update({process.pid: process for process in _sandbox_processes(layout)})
        alive = [process for process in victims.values() if _running(process)]
        if not alive:
            return
        for process in alive:
            with contextlib.suppress(OSError, psutil.Error):
                if os.getpgid(process.pid) == process.pid:
                    os.killpg(process.pid, signal.SIGKILL)
                else:
                    process.kill()
        psutil.wait_procs(alive, timeout=2)
        victims = {}


def _running(process: psutil.Process) -> bool:
    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _drain(pipe: Any, stream: int, output: BoundedOutput) -> None:
    """Read ``pipe`` to its end into ``output`` (what passes the cap is read and dropped)."""
    with contextlib.suppress(OSError, ValueError):
        while chunk := pipe.read1(65536):
            output.add(stream, chunk)
