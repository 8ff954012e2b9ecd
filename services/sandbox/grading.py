"""A grading, as one use of a sandbox: checks that open produced files run in a fresh, throwaway sandbox.

An agent's files are hostile input: a pickle runs code when loaded, and a crafted image or spreadsheet can
make a parser hang or eat memory. So ``run_file_checks`` never opens them in the grader's process. Each call
starts one grading sandbox of the sandbox image (the one the sessions ran in, so whatever a session could pickle
loads here) through a ``SandboxBackend`` (``grading_spec``: the grading's purpose, name and labels, no network at
all, the grading limits below), puts the grader's checker (``file_checks.py`` with ``model_loader.py``) and the
session's files in (``put_tree``), ``exec``s the checker with the image's Python, the request on its stdin and the
call's time limit, reads its one JSON line of results from the bounded output, and stops the sandbox, whatever
happened.

The hardening is the backend's, written once in its ``start`` for sessions and gradings alike: user 1000, every
capability dropped, ``no-new-privileges``, a read-only root, size-capped tmpfs ``/tmp`` and home, memory (no swap),
CPU and process limits, an environment with nothing of the grader's in it (the checker's few variables are its
argv's, ``CHECKER_ENVIRONMENT``). What a grading adds: no network interface but loopback, and (on Docker) a
workspace that belongs to root, so the checker reads the files and the checker's scripts but cannot change them or
fill the disk. The checker is an ``exec``, not the box's process 1: it ends what a pickle's code left running
after each load (``grader.file_checks`` does so where it finds itself in a grading sandbox: this environment's
variable, the sandbox user, and the sleeper as process 1), and, as a second line, only a single result line from a
checker that exited by itself is believed. The sandbox
carries ``pybench-eval.role=grading-sandbox`` and ``pybench-eval.project=pybench-eval``
and a name that starts with ``pbe-grd-`` (``services.sandbox.contract``); the backend's ``reap(purpose="grading")``
removes what a killed grader left behind.
"""

import io
import json
import tarfile
import time
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from services.errors import SandboxStartError, SandboxUnavailableError
from services.sandbox.base import SandboxBackend, SandboxSpec
from services.sandbox.contract import DEFAULT_SANDBOX_IMAGE, WORKSPACE
from services.verdict import CheckResult

DEFAULT_TIMEOUT_S = 60.0
"""How long one call's checks may run before the checker is killed (they then all fail)."""

DEFAULT_MEMORY_MB = 1024
"""The grading sandbox's memory limit (no swap): a file that needs more fails every check of the call."""

DEFAULT_CPUS = 1.0
"""The grading sandbox's CPU limit."""

DEFAULT_PIDS = 64
"""The grading sandbox's process and thread limit."""

DEFAULT_TMP_MB = 128
"""The size of the grading sandbox's writable ``/tmp``."""

DEFAULT_SPARE_MB = 64
"""Room in the grading sandbox's workspace beyond the files copied in."""

SANDBOX_PYTHON = "/opt/venv/bin/python"
"""The image's Python (its virtual environment has the scientific stack)."""

FILES_FOLDER = "workspace"
"""Where the session's files go in a grading's tree (beside the checker's scripts), and the checks run."""

CHECKER_ENVIRONMENT = {
    "HOME": "/tmp",
    "MPLCONFIGDIR": "/tmp/matplotlib",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
"""The checker's whole environment (the backend's ``exec`` passes none of the caller's)."""


def grading_spec(image: str = DEFAULT_SANDBOX_IMAGE, files_bytes: int = 0) -> SandboxSpec:
    """The sandbox a grading asks for: its purpose, no network, the grading limits, and a workspace with room for
    ``files_bytes`` of files."""
    return SandboxSpec(
        evaluation_id="",
        task_index=0,
        attempt=0,
        image=image,
        memory_mb=DEFAULT_MEMORY_MB,
        cpus=DEFAULT_CPUS,
        pids=DEFAULT_PIDS,
        workspace_mb=files_bytes // 2**20 + DEFAULT_SPARE_MB,
        tmp_mb=DEFAULT_TMP_MB,
        purpose="grading",
        network=False,
    )


def checker_command(checker: str, request: str, root: str | None = None) -> list[str]:
    """The argv that runs the ``checker`` script on ``request`` with the image's Python and ``CHECKER_ENVIRONMENT``
    (in the folder ``root`` when given)."""
    # An exec is not the box's process 1: the flag (with its uid and the sleeper as process 1) tells the checker it
    # may end what a pickle left running.
    exec_environment = {**CHECKER_ENVIRONMENT, "PBE_GRADING_SANDBOX": "1"}
    environment = [f"{key}={value}" for key, value in exec_environment.items()]
    run = ["env", *environment, SANDBOX_PYTHON, "-I", "-B", checker, request]
    return ["sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", root, *run] if root else run


def run_file_checks(
    backend: SandboxBackend,
    checks: list[dict[str, Any]],
    files: dict[str, bytes],
    *,
    checker: Mapping[str, bytes],
    image: str = DEFAULT_SANDBOX_IMAGE,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[CheckResult]:
    """Run ``checks`` (kinds of ``grader.file_checks``) on ``files`` in a fresh grading sandbox of ``backend``.

    Args:
        backend: where the grading sandbox runs.
        checks: the checks, as in the suite's ``checks.json``; paths in them are workspace-relative
            (``./output/2.csv``, ``./data/80.jpeg``).
        files: the workspace, by workspace-relative name (``output/2.csv``, ``data/80.jpeg``); a name ending
            in ``/`` is a folder (so an empty one can exist). A name that is absolute or climbs out with
            ``..`` is left out, and so is a file whose name is also a folder's (``a`` beside ``a/b``).
        checker: the checker's scripts by file name (``file_checks.py`` and what it runs), the grader's
            ``grader.file_checks.checker_sources()``.
        image: the sandbox image (it has the scientific stack, ffmpeg, and the Python that runs the checker).
        timeout_s: how long the checks may run once the files are in.

    Returns:
        One result per check, in order. A check that crashed, a garbled or missing answer, a sandbox that ran
        out of memory or time: failed results that say why (``grading sandbox timed out after N s``). An
        unknown kind: ``passed`` None.

    Raises:
        SandboxStartError: the backend cannot start the sandbox (the engine or cluster unreachable, the image
            missing: ``make images``), or lost it while grading.
    """
    if not checks:
        return []
    archive = grading_archive(files, checker)
    # The checker runs in the files' folder, and the request's root is "." (no backend's own paths in it).
    command = checker_command(f"{WORKSPACE}/file_checks.py", "/dev/stdin", root=f"{WORKSPACE}/{FILES_FOLDER}")
    handle = backend.start(grading_spec(image, len(archive)))
    try:
        backend.put_tree(handle, archive)
        started = time.monotonic()
        ended = backend.exec(handle, command, stdin=request_json(checks, "."), timeout_s=timeout_s)
    except SandboxUnavailableError as exc:
        raise SandboxStartError(f"lost grading sandbox {handle.name} while grading: {exc}") from exc
    finally:
        backend.stop(handle)
    # The checker ends what a pickle left after each load; should something still write into the output, only one
    # line from a checker that ended by itself is believed (it writes one line, then exits 0, or 2 when it refused
    # the request).
    if len(ended.stdout.splitlines()) > 1:
        return failed_results(checks, "grading sandbox's output was written to by something other than the checker")
    results = parse_results(ended.stdout, checks) if ended.exit_code in (0, 2) else None
    if results is not None:
        return results
    if ended.timed_out:
        # Killed by SIGKILL: at its time limit, or before it by the memory limit.
        if time.monotonic() - started >= timeout_s:
            return failed_results(checks, f"grading sandbox timed out after {timeout_s:g} s")
        return failed_results(
            checks, f"grading sandbox was killed, out of memory ({DEFAULT_MEMORY_MB} MiB) most likely"
        )
    errors = ended.stderr.decode(errors="replace").strip()
    last = errors.splitlines()[-1][:300] if errors else "no output"
    return failed_results(checks, f"grading sandbox gave no results (exit code {ended.exit_code}): {last}")


def parse_results(output: bytes, checks: list[dict[str, Any]]) -> list[CheckResult] | None:
    """The results in ``output`` (what ``file_checks.py`` printed): those of its last line that holds one
    well-formed result per check, under the checks' own kinds; failed results when the checker refused the
    request; None when no line will do."""
    for line in reversed(output.decode(errors="replace").splitlines()):
        try:
            answer = json.loads(line)
        except ValueError:
            continue
        results = answer.get("results") if isinstance(answer, dict) else None
        if not isinstance(results, list) or len(results) != len(checks):
            if isinstance(answer, dict) and "error" in answer:
                return failed_results(checks, f"grading sandbox refused the request: {str(answer['error'])[:300]}")
            continue
        if all(
            isinstance(r, dict) and r.get("passed") in (True, False, None) and isinstance(r.get("detail"), str)
            for r in results
        ):
            return [
                CheckResult(kind=str(check.get("kind", "")), passed=r["passed"], detail=r["detail"])
                for check, r in zip(checks, results, strict=True)
            ]
    return None


def failed_results(checks: list[dict[str, Any]], detail: str) -> list[CheckResult]:
    """Every check failed, with ``detail`` as the reason (the grading sandbox broke, not the checks)."""
    return [CheckResult(kind=str(check.get("kind", "")), passed=False, detail=detail) for check in checks]


def workspace_name(name: str) -> str | None:
    """``name`` as a member of the workspace (``./output/a.csv`` -> ``output/a.csv``, a folder keeps its ``/``);
    None when it is absolute, climbs out with ``..``, or is empty."""
    folder = name.endswith("/")
    parts = PurePosixPath(name.removeprefix("./")).parts
    if not parts or name.startswith("/") or "\x00" in name or any(part in ("..", ".") for part in parts):
        return None
    return "/".join(parts) + ("/" if folder else "")


def request_json(checks: list[dict[str, Any]], root: str) -> bytes:
    """The checker's request: the ``checks``, their files found under ``root``."""
    return json.dumps({"checks": checks, "root": root}, default=str).encode()


def grading_archive(files: dict[str, bytes], checker: Mapping[str, bytes]) -> bytes:
    """The tar of what a grading sandbox gets: the ``checker``'s scripts (and whatever else it maps, by name) at
    the top, the workspace's ``files`` under ``FILES_FOLDER``; all owned by root."""
    members: dict[str, bytes] = {}
    folders = {FILES_FOLDER}
    for name, data in files.items():
        relative = workspace_name(name)
        if relative is None:
            continue
        path = PurePosixPath(FILES_FOLDER, relative)
        folders.update(str(parent) for parent in path.parents if str(parent) != ".")
        if relative.endswith("/"):
            folders.add(str(path))
        else:
            members[str(path)] = data
    clashes = folders.intersection(members)  # a name that is also a folder (``a`` and ``a/b``): the folder stays
    buffer = io.BytesIO()
    now = int(time.time())
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for folder in sorted(folders, key=lambda f: (f.count("/"), f)):
            info = tarfile.TarInfo(folder)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, now
            tar.addfile(info)
        kept = sorted((path, data) for path, data in members.items() if path not in clashes)
        for member, data in [*checker.items(), *kept]:
            info = tarfile.TarInfo(member)
            info.size, info.mode, info.mtime = len(data), 0o644, now
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
