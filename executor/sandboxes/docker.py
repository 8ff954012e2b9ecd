"""The Docker backend: one container per session, from the sandbox image, on an internal network.

Each container runs ``jupyter kernelgateway`` as an unprivileged user with every capability dropped,
``no-new-privileges``, memory, CPU and process limits, and no network but an internal bridge that has no
route out (the executor reaches the gateway by the container's address on that bridge). Its only
environment variable is its own gateway token. Every container carries the labels
``pybench-eval.role=sandbox``, ``pybench-eval.evaluation``, ``.task`` and ``.attempt``, and a name that
starts with ``pbe-sbx-``, so ``reap`` finds what a crashed worker left behind.
"""

import io
import secrets
import tarfile
import time
from typing import Any

import docker.client
import docker.errors
import httpx
import requests

import docker
from executor.sandboxes.base import SandboxBackend, SandboxSpec
from services.errors import SandboxStartError, SandboxUnavailableError
from services.sandbox import SANDBOX_LABEL_PREFIX, SANDBOX_NAME_PREFIX, SandboxHandle

DEFAULT_GATEWAY_PORT = 8888
"""The port the kernel gateway listens on inside the container."""

DEFAULT_MAX_TREE_BYTES = 512 * 1024 * 1024
"""The most a sandbox may hand back from one folder; a larger output is refused, not read into memory."""

SANDBOX_UID = 1000
"""The unprivileged user the sandbox image runs as; files copied in belong to it."""

_ROLE_LABEL = f"{SANDBOX_LABEL_PREFIX}.role"


class DockerSandboxBackend(SandboxBackend):
    name = "docker"

    def __init__(self, network: str, client: Any = None) -> None:
        self.network = network
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            try:
                self._client = docker.client.from_env()
            except docker.errors.DockerException as exc:
                raise SandboxStartError(f"cannot reach the Docker engine: {exc}; is DOCKER_HOST right?") from exc
        return self._client

    def ensure_network(self) -> None:
        """Create the internal sandbox network when it does not exist yet."""
        if not self.client.networks.list(names=[self.network]):
            self.client.networks.create(
                self.network, driver="bridge", internal=True, labels={_ROLE_LABEL: "sandbox-network"}
            )

    def start(self, spec: SandboxSpec) -> SandboxHandle:
        token = secrets.token_urlsafe(24)
        name = (
            f"{SANDBOX_NAME_PREFIX}{spec.evaluation_id[:12]}-{spec.task_index}-a{spec.attempt}-{secrets.token_hex(3)}"
        )
        labels = {
            _ROLE_LABEL: "sandbox",
            f"{SANDBOX_LABEL_PREFIX}.evaluation": spec.evaluation_id,
            f"{SANDBOX_LABEL_PREFIX}.task": str(spec.task_index),
            f"{SANDBOX_LABEL_PREFIX}.attempt": str(spec.attempt),
        }
        try:
            self.ensure_network()
            # create + start, never run: run pulls a missing image, and sandboxes never reach a registry.
            container = self.client.containers.create(
                spec.image,
                name=name,
                labels=labels,
                environment={"KG_AUTH_TOKEN": token},
                network=self.network,
                user=f"{SANDBOX_UID}:{SANDBOX_UID}",
                mem_limit=f"{spec.memory_mb}m",
                memswap_limit=f"{spec.memory_mb}m",
                nano_cpus=int(spec.cpus * 1e9),
                pids_limit=spec.pids,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                tmpfs={"/tmp": "rw,nosuid,nodev,size=512m,mode=1777"},
                init=False,
            )
        except docker.errors.ImageNotFound as exc:
            raise SandboxStartError(f"sandbox image {spec.image!r} is missing: build it with `make images`") from exc
        except (docker.errors.DockerException, requests.RequestException) as exc:
            raise SandboxStartError(f"cannot start a sandbox container: {exc}") from exc
        try:
            container.start()
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
        except (docker.errors.DockerException, requests.RequestException, KeyError) as exc:
            self._remove(container.id)
            raise SandboxStartError(f"sandbox {name} did not start: {exc}") from exc
        except BaseException:
            self._remove(container.id)
            raise
        return handle

    def _wait_ready(self, container: Any, handle: SandboxHandle, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
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
        except (docker.errors.DockerException, requests.RequestException) as exc:
            raise SandboxUnavailableError(f"cannot reach sandbox {handle.name}: {exc}") from exc

    def put_file(self, handle: SandboxHandle, dest: str, data: bytes) -> None:
        folder, _, filename = dest.rpartition("/")
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            info = tarfile.TarInfo(filename)
            info.size = len(data)
            info.mode = 0o644
            info.uid = info.gid = SANDBOX_UID
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(data))
        try:
            ok = self._container(handle).put_archive(folder or "/", buffer.getvalue())
        except (docker.errors.DockerException, requests.RequestException) as exc:
            raise SandboxUnavailableError(f"cannot copy {dest} into sandbox {handle.name}: {exc}") from exc
        if not ok:
            raise SandboxUnavailableError(f"sandbox {handle.name} refused {dest}")

    def get_tree(self, handle: SandboxHandle, path: str) -> dict[str, bytes]:
        container = self._container(handle)
        try:
            stream, stat = container.get_archive(path)
        except docker.errors.NotFound:
            return {}
        except (docker.errors.DockerException, requests.RequestException) as exc:
            raise SandboxUnavailableError(f"cannot read {path} from sandbox {handle.name}: {exc}") from exc
        buffer = io.BytesIO()
        for chunk in stream:
            buffer.write(chunk)
            if buffer.tell() > DEFAULT_MAX_TREE_BYTES + 1024 * 1024:
                raise SandboxUnavailableError(
                    f"sandbox {handle.name} produced more than {DEFAULT_MAX_TREE_BYTES // 2**20} MiB under {path}"
                )
        buffer.seek(0)
        root = stat["name"]
        files: dict[str, bytes] = {}
        with tarfile.open(fileobj=buffer, mode="r") as tar:
            for member in tar:
                if not member.isreg():
                    continue
                relative = member.name[len(root) :].lstrip("/") if member.name.startswith(root) else member.name
                extracted = tar.extractfile(member)
                if relative and extracted is not None:
                    files[relative] = extracted.read()
        return files

    def _remove(self, container_id: str) -> None:
        try:
            self.client.api.remove_container(container_id, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except (docker.errors.DockerException, requests.RequestException):
            pass  # the reaper removes it later

    def stop(self, handle: SandboxHandle) -> None:
        self._remove(handle.sandbox_id)

    def reap(self, evaluation_id: str | None = None) -> list[str]:
        filters = [f"{_ROLE_LABEL}=sandbox"]
        if evaluation_id is not None:
            filters.append(f"{SANDBOX_LABEL_PREFIX}.evaluation={evaluation_id}")
        removed = []
        for container in self.client.containers.list(all=True, filters={"label": filters}):
            self._remove(container.id)
            removed.append(container.name)
        return removed
