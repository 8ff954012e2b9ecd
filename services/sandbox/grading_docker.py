"""The grading sandbox: checks that open produced files run in a fresh, throwaway container of the sandbox image.

An agent's files are hostile input: a pickle runs code when loaded, and a crafted image or spreadsheet can
make a parser hang or eat memory. So ``run_file_checks`` never opens them in the grader's process. Each call
starts one container of the sandbox image (the one the sessions ran in, so whatever a session could pickle
loads here) that runs ``grader/file_checks.py`` with the image's Python and prints one JSON line of results.

The container is hardened like the session sandboxes (``services.sandbox.docker``): no network at all
(``network_mode=none``), user 1000, every capability dropped, ``no-new-privileges``, a read-only root, a
size-capped tmpfs ``/tmp``, the image's ``/opt/venv`` and ``/usr`` from read-only volumes where the engine's storage
driver is FUSE (``services.sandbox.runtime_volumes``), memory (no swap), CPU and process limits, an environment with
nothing of the grader's in it. The files, the grader's checker (``file_checks.py`` with ``model_loader.py``) and the
request go into a volume of its own before it starts (a read-only root refuses copies anywhere else, and a tmpfs
volume would drop them before the start): the copied tree belongs to root, so the sandbox can read it but not
write to it or fill the disk. The container carries the labels ``pybench-eval.role=grading-sandbox`` and
``pybench-eval.project=pybench-eval``, its name and its volume's start with ``pbe-grd-`` (all defined in
``services.sandbox.contract``), and both are removed when the call returns, whatever happened; ``reap`` removes what
a killed grader left behind.
"""

import contextlib
import io
import json
import secrets
import tarfile
import time
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

import docker
import docker.client
import docker.errors
import requests

from services.errors import SandboxStartError
from services.sandbox.contract import (
    DEFAULT_SANDBOX_IMAGE,
    GRADING_NAME_PREFIX,
    GRADING_ROLE,
    LOG_LIMIT,
    PROJECT,
    PROJECT_LABEL,
    ROLE_LABEL,
    SANDBOX_UID,
    RuntimeVolumeMode,
    docker_created_epoch,
)
from services.sandbox.docker_errors import DOCKER_ERRORS
from services.sandbox.runtime_volumes import RuntimeVolumes
from services.verdict import CheckResult

DEFAULT_TIMEOUT_S = 60.0
"""How long one call's checks may run before the container is killed (they then all fail)."""

DEFAULT_MEMORY_MB = 1024
"""The container's memory limit (no swap): a file that needs more fails every check of the call."""

DEFAULT_CPUS = 1.0
"""The container's CPU limit."""

DEFAULT_PIDS = 64
"""The container's process and thread limit."""

DEFAULT_TMP_MB = 128
"""The size of the container's writable ``/tmp``."""

SANDBOX_PYTHON = "/opt/venv/bin/python"
"""The image's Python (its virtual environment has the scientific stack)."""

MOUNT = "/grading"
"""Where the volume is mounted: ``file_checks.py``, ``request.json``, and the files under ``workspace/``."""

GRADING_LABELS = {ROLE_LABEL: GRADING_ROLE, PROJECT_LABEL: PROJECT}
"""The labels of every grading sandbox (container, volume or pod)."""
WORKSPACE_ROOT = f"{MOUNT}/workspace"
"""Where the session's files are unpacked, and the checks run."""
CHECKER_ENVIRONMENT = {
    "HOME": "/tmp",
    "MPLCONFIGDIR": "/tmp/matplotlib",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
_LOG_RETRIES = 3
"""Reads of the container's output after it exits, should the engine not have written the last line yet."""


def run_file_checks(
    checks: list[dict[str, Any]],
    files: dict[str, bytes],
    *,
    checker: Mapping[str, bytes],
    image: str = DEFAULT_SANDBOX_IMAGE,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    client: Any = None,
    runtime_volume: RuntimeVolumeMode = "auto",
) -> list[CheckResult]:
    """Run ``checks`` (kinds of ``grader.file_checks``) on ``files`` in a fresh grading sandbox.

    Args:
        checks: the checks, as in the suite's ``checks.json``; paths in them are workspace-relative
            (``./output/2.csv``, ``./data/80.jpeg``).
        files: the workspace, by workspace-relative name (``output/2.csv``, ``data/80.jpeg``); a name ending
            in ``/`` is a folder (so an empty one can exist). A name that is absolute or climbs out with
            ``..`` is left out, and so is a file whose name is also a folder's (``a`` beside ``a/b``).
        checker: the checker's scripts by file name (``file_checks.py`` and what it runs), the grader's
            ``grader.file_checks.checker_sources()``.
        image: the sandbox image (it has the scientific stack, ffmpeg, and the Python that runs
            ``file_checks.py``).
        timeout_s: how long the checks may run once the container has started.
        client: a ``docker.DockerClient`` (default: from the environment).
        runtime_volume: serve the image's ``/opt/venv`` and ``/usr`` from read-only volumes
            (``services.sandbox.runtime_volumes``).

    Returns:
        One result per check, in order. A check that crashed, a garbled or missing answer, a sandbox that ran
        out of memory or time: failed results that say why (``grading sandbox timed out after N s``). An
        unknown kind: ``passed`` None.

    Raises:
        SandboxStartError: the Docker engine cannot be reached, or the image is missing (``make images``).
    """
    if not checks:
        return []
    engine = _engine(client)
    name = f"{GRADING_NAME_PREFIX}{secrets.token_hex(6)}"
    archive = request_archive(checks, files, checker)
    container_id: str | None = None
    try:
        try:
            engine.api.create_volume(name, driver="local", labels=GRADING_LABELS)
            source, mounts = RuntimeVolumes(engine, runtime_volume).mounts(image)
            container_id = _create(engine, source, name, mounts)
            if not engine.api.put_archive(container_id, MOUNT, archive):
                raise SandboxStartError(f"the Docker engine refused the files of grading sandbox {name}")
            engine.api.start(container_id)
        except docker.errors.ImageNotFound as exc:
            raise SandboxStartError(f"the sandbox image {image!r} is missing: build it with `make images`") from exc
        except DOCKER_ERRORS as exc:
            raise SandboxStartError(f"cannot start a grading sandbox: {exc}; is the Docker engine running?") from exc
        return _collect(engine, container_id, checks, timeout_s)
    finally:
        _remove(engine, container_id, name)


def _engine(client: Any) -> Any:
    if client is not None:
        return client
    try:
        return docker.client.from_env()
    except docker.errors.DockerException as exc:
        raise SandboxStartError(f"cannot reach the Docker engine: {exc}; is DOCKER_HOST right?") from exc


def _create(engine: Any, image: str, name: str, mounts: list[Any]) -> str:
    tmpfs = f"rw,nosuid,nodev,noexec,size={DEFAULT_TMP_MB}m,uid={SANDBOX_UID},gid={SANDBOX_UID},mode=0700"
    host_config = engine.api.create_host_config(
        binds={name: {"bind": MOUNT, "mode": "rw"}},
        mounts=mounts,
        network_mode="none",
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        read_only=True,
        tmpfs={"/tmp": tmpfs},
        mem_limit=f"{DEFAULT_MEMORY_MB}m",
        memswap_limit=f"{DEFAULT_MEMORY_MB}m",
        nano_cpus=int(DEFAULT_CPUS * 1e9),
        pids_limit=DEFAULT_PIDS,
        # The result line is read from the log: a driver that keeps it, and a cap on what a file can make spill.
        log_config={"Type": "json-file", "Config": LOG_LIMIT},
    )
    # create + start, never run: run pulls a missing image, and sandboxes never reach a registry. The checker
    # is process 1 (no init): the pickle-loading child then has no same-user process holding the output.
    created = engine.api.create_container(
        image,
        entrypoint=[SANDBOX_PYTHON, "-I", "-B", f"{MOUNT}/file_checks.py", f"{MOUNT}/request.json"],
        command=[],
        name=name,
        user=f"{SANDBOX_UID}:{SANDBOX_UID}",
        environment=CHECKER_ENVIRONMENT,
        working_dir=WORKSPACE_ROOT,
        labels=GRADING_LABELS,
        network_disabled=True,
        volumes=[MOUNT],
        host_config=host_config,
    )
    return str(created["Id"])


def _collect(engine: Any, container_id: str, checks: list[dict[str, Any]], timeout_s: float) -> list[CheckResult]:
    """Wait for the checks' answer; turn a timeout, a crash or garbage into failed results."""
    started = time.monotonic()
    try:
        status = engine.api.wait(container_id, timeout=timeout_s)
    except requests.RequestException as exc:
        # The client reports its read timeout as a ConnectionError, like a lost engine: the clock tells them apart.
        if time.monotonic() - started < timeout_s * 0.9:
            raise SandboxStartError(f"lost the Docker engine while grading: {exc}") from exc
        return failed_results(checks, f"grading sandbox timed out after {timeout_s:g} s")
    code = status.get("StatusCode")
    try:
        for attempt in range(_LOG_RETRIES):
            results = parse_results(engine.api.logs(container_id, stdout=True, stderr=False), checks)
            if results is not None:
                return results
            time.sleep(0.05 * (attempt + 1))
        state = engine.api.inspect_container(container_id).get("State", {})
        if state.get("OOMKilled"):
            return failed_results(checks, f"grading sandbox ran out of memory ({DEFAULT_MEMORY_MB} MiB)")
        errors = engine.api.logs(container_id, stdout=False, stderr=True, tail=3).decode(errors="replace")
    except DOCKER_ERRORS as exc:
        raise SandboxStartError(f"lost the Docker engine while grading: {exc}") from exc
    last = errors.strip().splitlines()[-1][:300] if errors.strip() else "no output"
    return failed_results(checks, f"grading sandbox gave no results (exit code {code}): {last}")


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


def request_archive(
    checks: list[dict[str, Any]], files: dict[str, bytes], checker: Mapping[str, bytes], root: str = WORKSPACE_ROOT
) -> bytes:
    """The tar of what a grading sandbox gets under ``MOUNT``: the ``checker``'s scripts, the request (its files
    found under ``root``), the workspace; all owned by root."""
    request = json.dumps({"checks": checks, "root": root}, default=str).encode()
    members: dict[str, bytes] = {}
    folders = {"workspace"}
    for name, data in files.items():
        relative = workspace_name(name)
        if relative is None:
            continue
        path = PurePosixPath("workspace", relative)
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
        top = {**checker, "request.json": request}
        kept = sorted((path, data) for path, data in members.items() if path not in clashes)
        for member, data in [*top.items(), *kept]:
            info = tarfile.TarInfo(member)
            info.size, info.mode, info.mtime = len(data), 0o644, now
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _remove(engine: Any, container_id: str | None, name: str) -> None:
    """Remove the container and its volume; best effort (``reap`` is the safety net)."""
    if container_id is not None:
        with contextlib.suppress(*DOCKER_ERRORS):
            engine.api.remove_container(container_id, force=True, v=True)
    with contextlib.suppress(*DOCKER_ERRORS):
        engine.api.remove_volume(name, force=True)


def reap(older_than_s: float = 0.0, client: Any = None) -> list[str]:
    """Remove grading containers and volumes older than ``older_than_s`` (a killed grader's leftovers).

    Returns:
        The names removed.

    Raises:
        SandboxStartError: the Docker engine cannot be reached.
    """
    engine = _engine(client)
    cutoff = time.time() - older_than_s
    label = f"{ROLE_LABEL}={GRADING_ROLE}"
    removed = []
    try:
        for container in engine.api.containers(all=True, filters={"label": label}):
            if container.get("Created", 0) <= cutoff:
                _remove(engine, container["Id"], container["Names"][0].lstrip("/"))
                removed.append(container["Names"][0].lstrip("/"))
        for volume in engine.api.volumes(filters={"label": label}).get("Volumes") or []:
            if docker_created_epoch(volume.get("CreatedAt", "")) <= cutoff and volume["Name"] not in removed:
                _remove(engine, None, volume["Name"])
                removed.append(volume["Name"])
    except DOCKER_ERRORS as exc:
        raise SandboxStartError(f"cannot reach the Docker engine: {exc}") from exc
    return removed
