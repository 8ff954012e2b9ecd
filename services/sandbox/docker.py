"""The Docker backend: one container per session, from the sandbox image, on an internal network.

Each container runs ``jupyter kernelgateway`` as an unprivileged user with every capability dropped,
``no-new-privileges``, memory (no swap), CPU and process limits, a read-only root filesystem, and no network but an
internal bridge that has no route out (the executor reaches the gateway by the container's address on that bridge).
What it may write is size-capped and in memory: ``/tmp`` and its home are tmpfs mounts, and ``/workspace`` is a
tmpfs-backed volume of its own (a volume, so files can be copied in and out of it while the root stays read-only).
Where the engine's storage driver is FUSE, its ``/opt/venv`` (the kernel gateway, the kernel and the scientific stack)
and ``/usr`` (the interpreter and the standard library) are the image's own, copied once into volumes and mounted
read-only (``services.sandbox.runtime_volumes``): the imports then do not go through a FUSE daemon. Its routing table
holds one route, to the executor (``_CONFINE_ENTRYPOINT``): no default route, and no way to another sandbox on the
shared bridge. Its only environment variable is its own gateway token. Every container carries the labels
``pybench-eval.role=sandbox``, ``pybench-eval.evaluation``, ``.task`` and ``.attempt``, and a name that starts with
``pbe-sbx-`` (``services.sandbox``), so ``reap`` finds what a crashed worker left behind; its workspace volume and the
network carry the project label and roles of their own.
"""

import contextlib
import ipaddress
import secrets
import socket
import tarfile
import threading
import time
from collections.abc import Sequence
from typing import Any

import docker
import docker.client
import docker.errors
import docker.types
import httpx

from services.errors import SandboxError, SandboxStartError, SandboxUnavailableError
from services.sandbox.base import (
    DEFAULT_EXEC_OUTPUT_BYTES,
    DEFAULT_EXEC_TIMEOUT_S,
    DEFAULT_MAX_TREE_BYTES,
    DEFAULT_MAX_TREE_FILES,
    EXEC_GRACE_S,
    BoundedOutput,
    ChunkReader,
    ExecResult,
    SandboxBackend,
    SandboxSpec,
    Tree,
    TreeCollector,
    archive_budget,
    check_exec,
    collect_tar,
    one_file_archive,
)
from services.sandbox.contract import (
    DEFAULT_GATEWAY_PORT,
    GRADING_LABELS,
    LOG_LIMIT,
    PROJECT,
    PROJECT_LABEL,
    PURPOSE_ROLES,
    ROLE_LABEL,
    SANDBOX_HOME,
    SANDBOX_UID,
    UNATTENDED_LIFETIME_S,
    WORKSPACE,
    RuntimeVolumeMode,
    SandboxHandle,
    SandboxPurpose,
    docker_created_epoch,
    grading_name,
    reap_selector,
    sandbox_labels,
    sandbox_name,
)
from services.sandbox.docker_errors import DOCKER_ERRORS
from services.sandbox.runtime_volumes import RuntimeVolumes

_WORKSPACE_ROLE = "sandbox-workspace"
_NETWORK_ROLE = "sandbox-network"
_CONFINE_ENTRYPOINT = "/usr/local/bin/confine-sandbox"
"""The sandbox image's entrypoint that confines its network and drops to the sandbox user
(``services/sandbox/image/confine-sandbox.sh``): the routing table keeps one host route, to the executor (no default
route: no internet, no metadata address; no route to another sandbox on the shared bridge), the engine's resolver
is out of reach, and then tini and the kernel gateway run as uid 1000 with every capability set empty."""
_CONFINE_CAPABILITIES = ("NET_ADMIN", "SETUID", "SETGID", "SETPCAP")
"""What the confining entrypoint holds as root, before it drops them all: the routes, and the drop itself."""
_STATE_CHECK_S = 1.0
"""While a sandbox's gateway does not answer yet, how often to ask the engine whether its container still runs."""
SESSION_CPU_SHARES = 1024
"""A session's sandbox's weight for the CPU when cores are contended (the engine's default, the stack's own)."""
BACKGROUND_CPU_SHARES = 256
"""A warm pool's sandbox's weight until a session takes it: its start (two Pythons, about a CPU-second) gets a
quarter of a session's share, so the cells of running sessions, which run against a time limit, go first."""


class DockerSandboxBackend(SandboxBackend):
    name = "docker"
    telemetry_scope = "cgroup"

    def __init__(self, network: str = "", client: Any = None, runtime_volume: RuntimeVolumeMode = "auto") -> None:
        self.network = network
        """The sessions' internal network (``PBE_SANDBOX_NETWORK``); a grading has none, and needs no name."""
        self._client = client
        self._runtime_mode = runtime_volume
        self._runtime: RuntimeVolumes | None = None
        self._peer: str | None = None
        self._network_lock = threading.Lock()
        self._network_ready = False

    @property
    def client(self) -> Any:
        if self._client is None:
            try:
                self._client = docker.client.from_env()
            except docker.errors.DockerException as exc:
                raise SandboxStartError(f"cannot reach the Docker engine: {exc}; is DOCKER_HOST right?") from exc
        return self._client

    @property
    def runtime(self) -> RuntimeVolumes:
        """The image's ``/opt/venv`` and ``/usr`` served from read-only volumes
        (``services.sandbox.runtime_volumes``)."""
        if self._runtime is None:
            self._runtime = RuntimeVolumes(self.client, self._runtime_mode)
        return self._runtime

    def problem(self) -> str | None:
        try:
            self.client.ping()
        except (*DOCKER_ERRORS, SandboxStartError) as exc:
            return (
                f"cannot reach the Docker engine ({exc}): check DOCKER_HOST, and that this process may use the "
                "engine's socket (in compose, DOCKER_GID must be the socket's group)"
            )
        return None

    def image_reference(self, image: str) -> str:
        try:
            return f"{image}@{self.client.images.get(image).id}"
        except (*DOCKER_ERRORS, SandboxStartError):
            return image

    def ensure_network(self) -> None:
        """Create the internal sandbox network when it does not exist yet (once per backend: sandboxes start in
        several threads at once, and two creations would make two networks of one name)."""
        with self._network_lock:
            if self._network_ready:
                return
            if not self.client.networks.list(names=[self.network]):
                self.client.networks.create(
                    self.network,
                    driver="bridge",
                    internal=True,
                    labels={PROJECT_LABEL: PROJECT, ROLE_LABEL: _NETWORK_ROLE},
                )
            self._network_ready = True

    def start(self, spec: SandboxSpec) -> SandboxHandle:
        """Create and start the container of ``spec`` (hardened alike for every purpose: see the module), and for a
        session wait until its kernel gateway answers.

        Raises:
            SandboxStartError: the engine is unreachable, the image is missing, or the sandbox did not start or
                become ready in time (it is removed before this is raised).
        """
        session = spec.purpose == "session"
        token = secrets.token_urlsafe(24) if session else ""
        if session:
            name = sandbox_name(spec.evaluation_id, spec.task_index, spec.attempt)
            labels = sandbox_labels(spec.evaluation_id, spec.task_index, spec.attempt, spec.worker)
        else:
            name, labels = grading_name(), dict(GRADING_LABELS)
        # A grading's workspace belongs to root: what is put there is read, never changed, by the sandbox user.
        owner = SANDBOX_UID if session else 0
        tmpfs = f"rw,nosuid,nodev,uid={SANDBOX_UID},gid={SANDBOX_UID},mode=0755,size={spec.tmp_mb}m"
        if not session:
            tmpfs += ",noexec"
        if spec.network and not self.network:
            raise SandboxStartError("no sandbox network is named: set PBE_SANDBOX_NETWORK")
        cap_add: tuple[str, ...] = ()
        try:
            if spec.network:
                self.ensure_network()
                # The confining entrypoint (root until it drops): before the volume, nothing to undo.
                entrypoint, user, cap_add = [_CONFINE_ENTRYPOINT, self.peer_address()], "0:0", _CONFINE_CAPABILITIES
                network: dict[str, Any] = {"network": self.network, "dns": ["127.0.0.1"]}
            else:
                # Nothing to confine and nothing to serve: the sandbox user from the first instruction, asleep (for
                # a bounded time: a grader killed mid-grading leaves a box that stops by itself).
                entrypoint = ["sleep", str(UNATTENDED_LIFETIME_S)]
                user, cap_add = f"{SANDBOX_UID}:{SANDBOX_UID}", ()
                network = {"network_mode": "none", "network_disabled": True}
            image, runtime_mounts = self.runtime.mounts(spec.image)
            self.client.volumes.create(
                name,
                driver="local",
                driver_opts={
                    "type": "tmpfs",
                    "device": "tmpfs",
                    "o": f"size={spec.workspace_mb}m,uid={owner},gid={owner},mode=0755,nosuid,nodev",
                },
                labels={**labels, ROLE_LABEL: _WORKSPACE_ROLE} if session else labels,
            )
            # create + start, never run: run pulls a missing image, and sandboxes never reach a registry.
            container = self.client.containers.create(
                image,
                name=name,
                labels=labels,
                environment={"KG_AUTH_TOKEN": token} if session else {},
                entrypoint=entrypoint,
                command=[],
                user=user,
                mem_limit=f"{spec.memory_mb}m",
                memswap_limit=f"{spec.memory_mb}m",
                nano_cpus=int(spec.cpus * 1e9),
                cpu_shares=BACKGROUND_CPU_SHARES if spec.background else SESSION_CPU_SHARES,
                pids_limit=spec.pids,
                cap_drop=["ALL"],
                cap_add=list(cap_add),
                security_opt=["no-new-privileges"],
                read_only=True,
                tmpfs={"/tmp": tmpfs, SANDBOX_HOME: tmpfs},
                volumes={name: {"bind": WORKSPACE, "mode": "rw"}},
                mounts=runtime_mounts,
                init=False,
                log_config=docker.types.LogConfig(type="json-file", config=LOG_LIMIT),
                **network,
            )
        except docker.errors.ImageNotFound as exc:
            self._remove_volume(name)
            raise SandboxStartError(f"sandbox image {spec.image!r} is missing: build it with `make images`") from exc
        except DOCKER_ERRORS as exc:
            self._remove_volume(name)
            raise SandboxStartError(f"cannot start a sandbox container: {exc}; is the Docker engine running?") from exc
        try:
            container.start()
            if not session:
                return SandboxHandle(
                    backend=self.name,
                    sandbox_id=container.id,
                    name=name,
                    url="",
                    token="",
                    image=spec.image,
                    labels=labels,
                )
            container.reload()
            address = container.attrs["NetworkSettings"]["Networks"][self.network]["IPAddress"]
            handle = SandboxHandle(
                backend=self.name,
                sandbox_id=container.id,
                name=name,
                url=f"http://{address}:{DEFAULT_GATEWAY_PORT}",
                token=token,
                image=spec.image,
                labels=labels,
            )
            self._wait_ready(container, handle, spec.ready_timeout_s)
        except (*DOCKER_ERRORS, KeyError) as exc:
            self._remove(container.id, name)
            hint = (
                "; the image predates this executor: rebuild it with `make images`"
                if _CONFINE_ENTRYPOINT in str(exc)
                else ""
            )
            raise SandboxStartError(f"sandbox {name} did not start: {exc}{hint}") from exc
        except BaseException:
            self._remove(container.id, name)
            raise
        return handle

    def peer_address(self) -> str:
        """The one address a sandbox exchanges packets with: this executor's own on the sandbox network (when
        it runs in a container attached to it, as in compose), else the network's gateway (the host).

        Raises:
            SandboxStartError: neither is known (a network without IPAM gateway, an executor not attached), or
                what the engine gave is not an IP address.
        """
        if self._peer is None:
            own = None
            with contextlib.suppress(*DOCKER_ERRORS):
                own = self.client.containers.get(socket.gethostname())
            networks = own.attrs["NetworkSettings"]["Networks"] if own is not None else {}
            if self.network in networks and networks[self.network].get("IPAddress"):
                peer = str(networks[self.network]["IPAddress"])
            else:
                configs = self.client.networks.get(self.network).attrs.get("IPAM", {}).get("Config") or [{}]
                gateway = configs[0].get("Gateway")
                if not gateway:
                    raise SandboxStartError(
                        f"network {self.network} has no gateway address and this executor is not attached to it: "
                        "recreate the network with `docker network rm` (the executor creates it again)"
                    )
                peer = str(gateway)
            try:  # it becomes an argument of the sandbox's entrypoint: one address, nothing else
                self._peer = str(ipaddress.ip_address(peer))
            except ValueError as exc:
                raise SandboxStartError(
                    f"the executor's address on {self.network} is not an IP address: {peer!r}"
                ) from exc
        return self._peer

    def _wait_ready(self, container: Any, handle: SandboxHandle, timeout_s: float) -> None:
        """Ask the kernel gateway for ``/api`` until it answers, looking at the container's state (an engine
        request) only every ``_STATE_CHECK_S`` while it does not: many sandboxes start at once, and the engine's
        CPU is theirs.

        Raises:
            SandboxStartError: the container exited, or the gateway did not answer within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        next_state_check = time.monotonic() + _STATE_CHECK_S
        last_error = "no answer"
        with httpx.Client(timeout=2.0) as http:
            while time.monotonic() < deadline:
                try:
                    response = http.get(f"{handle.url}/api", headers={"Authorization": f"token {handle.token}"})
                    if response.status_code == 200:
                        return
                    last_error = f"HTTP {response.status_code}"
                except httpx.HTTPError as exc:
                    last_error = str(exc) or type(exc).__name__
                if time.monotonic() >= next_state_check:
                    next_state_check = time.monotonic() + _STATE_CHECK_S
                    container.reload()
                    if container.status not in ("created", "running"):
                        logs = container.logs(tail=20).decode(errors="replace")
                        raise SandboxStartError(f"sandbox {handle.name} exited while starting: {logs}")
                time.sleep(0.05)
        raise SandboxStartError(
            f"sandbox {handle.name}'s kernel gateway did not answer within {timeout_s:.0f} s ({last_error})"
        )

    def _container(self, handle: SandboxHandle) -> Any:
        try:
            return self.client.containers.get(handle.sandbox_id)
        except docker.errors.NotFound as exc:
            raise SandboxUnavailableError(f"sandbox {handle.name} is gone") from exc
        except DOCKER_ERRORS as exc:
            raise SandboxUnavailableError(f"cannot reach sandbox {handle.name}: {exc}") from exc

    def put_file(self, handle: SandboxHandle, dest: str, data: bytes) -> None:
        """Write ``dest`` (under ``/workspace``; missing folders are made, owned by the sandbox user).

        Raises:
            SandboxError: ``dest`` is not under ``/workspace`` or climbs out of it.
            SandboxUnavailableError: the sandbox is gone or refused the file.
        """
        parts = [part for part in dest.split("/") if part]
        if not dest.startswith(WORKSPACE + "/") or len(parts) < 2 or ".." in parts or "." in parts:
            raise SandboxError(
                f"cannot write {dest!r}: sandbox files go under {WORKSPACE}/, e.g. {WORKSPACE}/data/a.csv"
            )
        self._put_archive(handle, one_file_archive(parts[1:], data, SANDBOX_UID), dest)

    def put_tree(self, handle: SandboxHandle, archive: bytes) -> None:
        """Unpack ``archive`` under ``/workspace`` through the engine, each member keeping the owner the archive
        gives it (root's, in a grading sandbox).

        Raises:
            SandboxUnavailableError: the sandbox is gone or refused the files.
        """
        self._put_archive(handle, archive, "the files")

    def _put_archive(self, handle: SandboxHandle, archive: bytes, what: str) -> None:
        try:
            ok = self._container(handle).put_archive(WORKSPACE, archive)
        except DOCKER_ERRORS as exc:
            raise SandboxUnavailableError(f"cannot copy {what} into sandbox {handle.name}: {exc}") from exc
        if not ok:
            raise SandboxUnavailableError(f"sandbox {handle.name} refused {what}")

    def exec(
        self,
        handle: SandboxHandle,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout_s: float = DEFAULT_EXEC_TIMEOUT_S,
        max_output_bytes: int = DEFAULT_EXEC_OUTPUT_BYTES,
    ) -> ExecResult:
        """An exec of the engine's, as the sandbox user in ``/workspace``, killed by ``timeout`` inside the box; its
        stream is read frame by frame (never whole) until the command ends, or a few seconds past its time limit.

        Raises:
            SandboxUnavailableError: the sandbox is gone, or the engine lost the exec.
            ValueError: a bad ``argv``, ``timeout_s`` or ``max_output_bytes``.
        """
        command = check_exec(argv, timeout_s, max_output_bytes)
        api = self.client.api
        try:
            created = api.exec_create(
                handle.sandbox_id,
                command,
                stdin=stdin is not None,
                user=f"{SANDBOX_UID}:{SANDBOX_UID}",
                workdir=WORKSPACE,
                environment={"KG_AUTH_TOKEN": ""},  # the box's own variable: not the command's to read
            )
            connection = api.exec_start(created["Id"], socket=True)
        except docker.errors.NotFound as exc:
            raise SandboxUnavailableError(f"sandbox {handle.name} is gone") from exc
        except DOCKER_ERRORS as exc:
            raise SandboxUnavailableError(f"cannot run a command in sandbox {handle.name}: {exc}") from exc
        raw: socket.socket = getattr(connection, "_sock", connection)
        output = BoundedOutput(max_output_bytes)
        deadline = time.monotonic() + timeout_s + EXEC_GRACE_S
        try:
            if stdin is not None:
                raw.sendall(stdin)
                raw.shutdown(socket.SHUT_WR)
            _read_exec_frames(raw, output, deadline)
        except OSError as exc:
            raise SandboxUnavailableError(f"lost the command's stream in sandbox {handle.name}: {exc}") from exc
        finally:
            with contextlib.suppress(OSError):
                raw.close()
        code = self._exec_status(created["Id"], handle)
        return output.result(code)

    def _exec_status(self, exec_id: str, handle: SandboxHandle) -> int:
        """The exit status of a finished exec (the engine records it a moment after the stream ends).

        Raises:
            SandboxUnavailableError: the engine lost the exec, or it is still running past its time limit.
        """
        for _ in range(50):
            try:
                state = self.client.api.exec_inspect(exec_id)
            except DOCKER_ERRORS as exc:
                raise SandboxUnavailableError(f"lost a command's status in sandbox {handle.name}: {exc}") from exc
            if not state.get("Running") and state.get("ExitCode") is not None:
                return int(state["ExitCode"])
            time.sleep(0.02)
        raise SandboxUnavailableError(f"a command in sandbox {handle.name} outlived its time limit")

    def get_tree(
        self,
        handle: SandboxHandle,
        path: str,
        *,
        max_files: int = DEFAULT_MAX_TREE_FILES,
        max_bytes: int = DEFAULT_MAX_TREE_BYTES,
    ) -> Tree:
        """Stream the folder out of the container as a tar archive, keeping what ``TreeCollector`` keeps (the
        rest of the archive is read through, never held).

        Raises:
            SandboxUnavailableError: the sandbox is gone, or the engine failed or sent a broken archive.
        """
        container = self._container(handle)
        try:
            stream, stat = container.get_archive(path)
        except docker.errors.NotFound:
            return Tree(max_files=max_files, max_bytes=max_bytes)
        except DOCKER_ERRORS as exc:
            raise SandboxUnavailableError(f"cannot read {path} from sandbox {handle.name}: {exc}") from exc
        root = stat["name"]
        collector = TreeCollector(max_files, max_bytes)
        try:
            collect_tar(
                ChunkReader(stream, limit=archive_budget(max_files, max_bytes)),
                collector,
                lambda name: name[len(root) :].lstrip("/") if name.startswith(root) else name,
            )
        except (*DOCKER_ERRORS, tarfile.TarError, OSError) as exc:
            raise SandboxUnavailableError(f"cannot read {path} from sandbox {handle.name}: {exc}") from exc
        tree = collector.tree()
        if tree.stopped_after is not None:
            # The archive was left unread: its connection must not go back to the pool for the next request.
            with contextlib.suppress(Exception):
                stream.close()
            self.client.api.close()
        return tree

    def _remove_volume(self, name: str) -> None:
        with contextlib.suppress(*DOCKER_ERRORS):  # gone already, or the reaper removes it later
            self.client.api.remove_volume(name, force=True)

    def _remove(self, container_id: str, name: str) -> None:
        with contextlib.suppress(*DOCKER_ERRORS):  # gone already, or the reaper removes it later
            self.client.api.remove_container(container_id, force=True, v=True)
        self._remove_volume(name)

    def promote(self, handle: SandboxHandle) -> None:
        try:
            self.client.api.update_container(handle.sandbox_id, cpu_shares=SESSION_CPU_SHARES)
        except DOCKER_ERRORS as exc:
            raise SandboxUnavailableError(f"sandbox {handle.name} is gone: {exc}") from exc

    def stop(self, handle: SandboxHandle) -> None:
        self._remove(handle.sandbox_id, handle.name)

    def reap(
        self,
        evaluation_id: str | None = None,
        older_than_s: float = 0.0,
        *,
        worker: str | None = None,
        purpose: SandboxPurpose = "session",
    ) -> list[str]:
        """Remove the containers of ``purpose`` (and their workspace volumes) older than ``older_than_s``.

        Raises:
            SandboxStartError: the Docker engine cannot be reached.
        """
        selector = reap_selector(evaluation_id, worker)
        filters = [f"{ROLE_LABEL}={PURPOSE_ROLES[purpose]}", *(f"{key}={value}" for key, value in selector.items())]
        # A grading's volume carries the grading role itself; a session's has a role of its own.
        volume_role = _WORKSPACE_ROLE if purpose == "session" else PURPOSE_ROLES[purpose]
        cutoff = time.time() - older_than_s
        removed = []
        try:
            for container in self.client.containers.list(all=True, filters={"label": filters}, ignore_removed=True):
                if docker_created_epoch(container.attrs.get("Created", "")) <= cutoff:
                    self._remove(container.id, container.name)
                    removed.append(container.name)
            workspace_filters = [f"{ROLE_LABEL}={volume_role}", *filters[1:]]
            for volume in self.client.volumes.list(filters={"label": workspace_filters}):
                if docker_created_epoch(volume.attrs.get("CreatedAt", "")) <= cutoff and volume.name not in removed:
                    self._remove_volume(volume.name)
                    removed.append(volume.name)
        except DOCKER_ERRORS as exc:
            raise SandboxStartError(f"cannot reach the Docker engine: {exc}") from exc
        return removed


def _read_exec_frames(raw: socket.socket, output: BoundedOutput, deadline: float) -> None:
    """Read an exec's multiplexed stream (8-byte headers: stream, 3 zero bytes, big-endian length) into ``output``
    until the engine closes it.

    Raises:
        OSError: the connection broke, or ``deadline`` (``time.monotonic()``) passed first.
    """
    buffer = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the command's stream did not end in time")
        raw.settimeout(left)
        chunk = raw.recv(65536)
        if not chunk:
            return
        buffer += chunk
        while len(buffer) >= 8:
            size = int.from_bytes(buffer[4:8], "big")
            if len(buffer) < 8 + size:
                break
            stream = buffer[0]
            output.add(stream if stream in (1, 2) else 1, buffer[8 : 8 + size])
            buffer = buffer[8 + size :]
