"""The Kubernetes backend: one pod per sandbox (a session's or a grading's), from the sandbox image, in the
sandboxes' namespace.

Each pod is hardened as the Docker sandboxes are (``services.sandbox.k8s_pods``: user 1000, read-only root, every
capability dropped, no privilege escalation, seccomp ``RuntimeDefault``, memory-backed size-capped ``emptyDir``
folders for ``/workspace``, ``/tmp`` and its home, CPU and memory requests equal to limits, no service-account
token, no service links, an active deadline; ``runtimeClassName`` when ``PBE_K8S_RUNTIME_CLASS`` names one). It
runs the image's own program, the kernel gateway on port 8888, whose only variable from us is its token; the
executor reaches it at the pod's IP (the namespace's NetworkPolicy lets only executor pods in, and nothing out).

A grading's pod (``purpose="grading"``, ``services.sandbox.grading``) is hardened alike and runs no program of the
image: it only sleeps (``UNATTENDED_LIFETIME_S`` at most, its active deadline too), listens on no port and holds no
token; the checker is ``exec``'d into it. Its memory limit is the spec's plus its workspace's size, since the
memory-backed workspace counts against it.

Files go in and out through the ``pods/exec`` subresource, as tar over the exec stream (no shared volume):
``put_file`` pipes a one-file archive into ``tar -x`` in ``/workspace``, ``put_tree`` a whole one; ``get_tree``
reads ``tar -c`` of a folder as it streams and keeps what ``TreeCollector`` keeps.

Pods carry the project's labels (``services.sandbox``) and the deployment's (``app.kubernetes.io/part-of``,
``app.kubernetes.io/component: sandbox`` or ``grading-sandbox``); names start with ``pbe-sbx-`` or ``pbe-grd-``.
``reap`` deletes by purpose, label selector (evaluation, worker) and age.

Known gaps beside the docker backend: no process limit of its own (Kubernetes has none per pod; the kubelet's
``podPidsLimit`` applies), the network rules are the namespace's NetworkPolicy, not the backend's, and exec runs
as the pod's user, so the files put into a grading's pod belong to the user the checks run as (on Docker they
belong to root): a check can change them, within the pod's own size cap.
"""

import contextlib
import json
import secrets
import tarfile
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import httpx
from kubernetes import client
from kubernetes.client.rest import ApiException

from services.errors import SandboxError, SandboxStartError, SandboxUnavailableError
from services.sandbox import k8s_client
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
    PROJECT,
    PROJECT_LABEL,
    PURPOSE_ROLES,
    ROLE_LABEL,
    SANDBOX_HOME,
    SANDBOX_UID,
    UNATTENDED_LIFETIME_S,
    WORKSPACE,
    SandboxHandle,
    SandboxPurpose,
    grading_name,
    reap_selector,
    sandbox_labels,
    sandbox_name,
)
from services.sandbox.k8s_pods import (
    CONTAINER_NAME,
    DEFAULT_NAMESPACE,
    GRADING_COMPONENT,
    SESSION_COMPONENT,
    created_epoch,
    label_selector,
    pod_labels,
    sandbox_pod,
)

DEFAULT_ACTIVE_DEADLINE_S = 12 * 3600
"""The most seconds a session pod lives (warm in the pool, then serving a session) before Kubernetes ends it:
a safety net for a pod a crashed worker forgot, far beyond any session."""

DEFAULT_PROBLEM_TTL_S = 10.0
"""How long a passed ``problem`` check holds before the cluster is asked again (the worker asks before each job)."""

_PROBE_POD = "pbe-sbx-probe"
_ERRORS = (ApiException, *k8s_client.TRANSIENT_ERRORS)


class KubernetesSandboxBackend(SandboxBackend):
    """Sandboxes as pods (see the module docstring)."""

    name = "kubernetes"
    telemetry_scope = "cgroup"

    def __init__(
        self,
        namespace: str = DEFAULT_NAMESPACE,
        runtime_class: str | None = None,
        *,
        configuration: client.Configuration | None = None,
        active_deadline_s: int = DEFAULT_ACTIVE_DEADLINE_S,
        gateway_port_for: Callable[[str], int] | None = None,
    ) -> None:
        """``configuration``: the cluster's (default: in-cluster, else ``KUBECONFIG``, loaded when first needed);
        ``gateway_port_for``: for tests only, the port of a pod's kernel gateway by pod name (a fake API server's
        pods all share one address); None: ``DEFAULT_GATEWAY_PORT``."""
        self.namespace = namespace
        self.runtime_class = runtime_class or None
        self.active_deadline_s = active_deadline_s
        self._configuration = configuration
        self._core: client.CoreV1Api | None = None
        self._gateway_port_for = gateway_port_for
        self._lock = threading.Lock()
        self._healthy_until = 0.0

    @property
    def configuration(self) -> client.Configuration:
        """Raises SandboxStartError: no cluster configuration is there (``k8s_client.load_configuration``)."""
        with self._lock:
            if self._configuration is None:
                self._configuration = k8s_client.load_configuration()
            return self._configuration

    @property
    def core(self) -> client.CoreV1Api:
        configuration = self.configuration
        with self._lock:
            if self._core is None:
                self._core = client.CoreV1Api(client.ApiClient(configuration))
            return self._core

    def pod_manifest(self, spec: SandboxSpec, name: str, token: str) -> dict[str, Any]:
        """The pod a sandbox of ``spec`` is, as sent to the API server: a session's serves its kernel gateway with
        ``token``; a grading's only sleeps (see the module)."""
        writable = {WORKSPACE: spec.workspace_mb, "/tmp": spec.tmp_mb, SANDBOX_HOME: spec.tmp_mb}
        if spec.purpose == "grading":
            return sandbox_pod(
                name=name,
                namespace=self.namespace,
                image=spec.image,
                labels=pod_labels(dict(GRADING_LABELS), GRADING_COMPONENT),
                memory_mb=spec.memory_mb + spec.workspace_mb,
                cpus=spec.cpus,
                writable=writable,
                active_deadline_s=UNATTENDED_LIFETIME_S,
                command=["sleep", str(UNATTENDED_LIFETIME_S)],
                runtime_class=self.runtime_class,
                working_dir=WORKSPACE,
            )
        labels = pod_labels(
            sandbox_labels(spec.evaluation_id, spec.task_index, spec.attempt, spec.worker), SESSION_COMPONENT
        )
        return sandbox_pod(
            name=name,
            namespace=self.namespace,
            image=spec.image,
            labels=labels,
            memory_mb=spec.memory_mb,
            cpus=spec.cpus,
            writable=writable,
            active_deadline_s=self.active_deadline_s,
            env={"KG_AUTH_TOKEN": token},
            ports={"gateway": DEFAULT_GATEWAY_PORT},
            runtime_class=self.runtime_class,
        )

    def problem(self) -> str | None:
        """Why sandboxes cannot start now: no configuration, the API unreachable, the namespace missing, the
        rights missing, or the cluster refusing the pod (its Pod Security admission, say); checked by listing
        pods and by a server-side dry run of a pod's creation. A passed check holds ``DEFAULT_PROBLEM_TTL_S``."""
        if time.monotonic() < self._healthy_until:
            return None
        try:
            core = self.core
            host = self.configuration.host
        except SandboxStartError as exc:
            return str(exc)
        try:
            core.list_namespaced_pod(
                self.namespace, limit=1, _preload_content=False, _request_timeout=k8s_client.DEFAULT_API_TIMEOUT_S
            )
            probe = SandboxSpec(evaluation_id="probe", task_index=0, attempt=1, image="probe")
            core.create_namespaced_pod(
                self.namespace,
                self.pod_manifest(probe, _PROBE_POD, "probe"),
                dry_run="All",
                _preload_content=False,
                _request_timeout=k8s_client.DEFAULT_API_TIMEOUT_S,
            )
        except _ERRORS as exc:
            if isinstance(exc, ApiException) and exc.status in (400, 422):
                return (
                    f"the cluster refuses sandbox pods in {self.namespace} "
                    f"({k8s_client.describe_api_error(exc, self.namespace, host)}): check the namespace's admission "
                    "rules and PBE_K8S_RUNTIME_CLASS"
                )
            return k8s_client.describe_api_error(exc, self.namespace, host)
        self._healthy_until = time.monotonic() + DEFAULT_PROBLEM_TTL_S
        return None

    def start(self, spec: SandboxSpec) -> SandboxHandle:
        """Create the pod and watch it until it runs; for a session, wait until its kernel gateway answers at its
        IP.

        Raises:
            SandboxStartError: no cluster configuration; the API refused the pod (forbidden, no namespace) or
                could not be reached; the pod failed, ended, was deleted or cannot pull its image while starting;
                or it was not ready within ``spec.ready_timeout_s``. The pod is deleted before this is raised.
        """
        session = spec.purpose == "session"
        deadline = time.monotonic() + spec.ready_timeout_s
        token = secrets.token_urlsafe(24) if session else ""
        name = sandbox_name(spec.evaluation_id, spec.task_index, spec.attempt) if session else grading_name()
        manifest = self.pod_manifest(spec, name, token)
        core = self.core
        try:
            core.create_namespaced_pod(
                self.namespace, manifest, _preload_content=False, _request_timeout=k8s_client.DEFAULT_API_TIMEOUT_S
            )
        except _ERRORS as exc:
            # A create whose answer was lost may have made the pod: delete it whatever happened.
            k8s_client.delete_pod(core, name, self.namespace)
            why = k8s_client.describe_api_error(exc, self.namespace, self.configuration.host)
            raise SandboxStartError(f"cannot create sandbox pod {name}: {why}") from exc
        try:
            pod = k8s_client.wait_running(core, name, self.namespace, deadline)
            url = ""
            if session:
                address = str(pod["status"]["podIP"])
                host = f"[{address}]" if ":" in address else address
                port = self._gateway_port_for(name) if self._gateway_port_for else DEFAULT_GATEWAY_PORT
                url = f"http://{host}:{port}"
            handle = SandboxHandle(
                backend=self.name,
                sandbox_id=str(pod["metadata"].get("uid", name)),
                name=name,
                url=url,
                token=token,
                image=spec.image,
                created_at=datetime.now(UTC),
                labels=manifest["metadata"]["labels"],
            )
            if session:
                self._wait_ready(handle, deadline, spec.ready_timeout_s)
        except BaseException:
            k8s_client.delete_pod(core, name, self.namespace)
            raise
        return handle

    def _wait_ready(self, handle: SandboxHandle, deadline: float, timeout_s: float) -> None:
        """Wait until the gateway answers ``GET /api``; every second, make sure the pod still runs.

        Raises:
            SandboxStartError: the pod stopped running, or the gateway did not answer by ``deadline``.
        """
        last_error = "no answer"
        next_check = time.monotonic() + 1.0
        with httpx.Client(timeout=2.0) as http:
            while time.monotonic() < deadline:
                try:
                    response = http.get(f"{handle.url}/api", headers={"Authorization": f"token {handle.token}"})
                    if response.status_code == 200:
                        return
                    last_error = f"HTTP {response.status_code}"
                except httpx.HTTPError as exc:
                    last_error = str(exc) or type(exc).__name__
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + 1.0
                    self._require_running(handle.name)
                time.sleep(0.05)
        raise SandboxStartError(
            f"sandbox pod {handle.name}'s kernel gateway did not answer within {timeout_s:.0f} s ({last_error}); "
            "raise PBE_SANDBOX_READY_TIMEOUT_S if the nodes are busy"
        )

    def _require_running(self, name: str) -> None:
        try:
            response = self.core.read_namespaced_pod(
                name, self.namespace, _preload_content=False, _request_timeout=k8s_client.DEFAULT_API_TIMEOUT_S
            )
            pod = json.loads(response.data)
        except ApiException as exc:
            if exc.status == 404:
                raise SandboxStartError(f"sandbox pod {name} was deleted while starting") from exc
            return
        except k8s_client.TRANSIENT_ERRORS:
            return
        phase = (pod.get("status") or {}).get("phase")
        if phase != "Running":
            raise SandboxStartError(f"sandbox pod {name} stopped while its kernel gateway started (phase {phase})")

    def _run(
        self,
        handle: SandboxHandle,
        command: list[str],
        stdin: bytes = b"",
        on_stdout: Callable[[bytes], None] | None = None,
    ) -> k8s_client.ExecResult:
        return k8s_client.run_in_pod(
            self.configuration, handle.name, self.namespace, command, CONTAINER_NAME, stdin, on_stdout=on_stdout
        )

    def exec(
        self,
        handle: SandboxHandle,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout_s: float = DEFAULT_EXEC_TIMEOUT_S,
        max_output_bytes: int = DEFAULT_EXEC_OUTPUT_BYTES,
    ) -> ExecResult:
        """The pod's exec subresource, in ``/workspace``, killed by ``timeout`` inside the pod. The exec protocol
        cannot close stdin, so the command reads exactly ``stdin``'s bytes (``head -c``) and then end of file. The
        stream keeps only the last 8 KiB of stderr, so ``stderr`` is at most that.

        Raises:
            SandboxUnavailableError: the pod is gone, the stream broke, or it outlived its time limit.
            ValueError: a bad ``argv``, ``timeout_s`` or ``max_output_bytes``.
        """
        command = check_exec(argv, timeout_s, max_output_bytes)
        data = stdin or b""
        script = 'cd "$0" || exit 126; n=$1; shift; head -c "$n" | "$@"'
        output = BoundedOutput(max_output_bytes)
        try:
            result = k8s_client.run_in_pod(
                self.configuration,
                handle.name,
                self.namespace,
                ["sh", "-c", script, WORKSPACE, str(len(data)), *command],
                CONTAINER_NAME,
                data,
                deadline=time.monotonic() + timeout_s + EXEC_GRACE_S,
                on_stdout=lambda chunk: output.add(1, chunk),
            )
        except TimeoutError as exc:
            raise SandboxUnavailableError(f"a command in sandbox pod {handle.name} outlived its time limit") from exc
        output.add(2, result.stderr)
        return output.result(result.exit_code)

    def put_file(self, handle: SandboxHandle, dest: str, data: bytes) -> None:
        """Write ``dest`` (under ``/workspace``; missing folders are made) through ``tar -x`` over exec.

        Raises:
            SandboxError: ``dest`` is not under ``/workspace`` or climbs out of it.
            SandboxUnavailableError: the pod is gone, or tar refused the file (its message is in the error).
        """
        parts = [part for part in dest.split("/") if part]
        if not dest.startswith(WORKSPACE + "/") or len(parts) < 2 or ".." in parts or "." in parts or "\0" in dest:
            raise SandboxError(
                f"cannot write {dest!r}: sandbox files go under {WORKSPACE}/, e.g. {WORKSPACE}/data/a.csv"
            )
        self._unpack(handle, one_file_archive(parts[1:], data, SANDBOX_UID), dest)

    def put_tree(self, handle: SandboxHandle, archive: bytes) -> None:
        """Unpack the tar ``archive`` under ``/workspace`` with one ``tar -x`` over exec (folders, empty ones too,
        and files; all owned by the pod's user: see the module's known gaps). tar refuses members that climb out.

        Raises:
            SandboxUnavailableError: the pod is gone, or tar refused the archive (its message is in the error).
        """
        self._unpack(handle, archive, "the files")

    def _unpack(self, handle: SandboxHandle, archive: bytes, what: str) -> None:
        """``tar -x`` of ``archive`` in ``/workspace``. Raises: SandboxUnavailableError: the pod is gone, or tar
        refused ``what``."""
        # head -c: the v4 exec protocol cannot close stdin, so tar is given exactly the archive's bytes.
        script = 'head -c "$2" | tar -x -o -f - -C "$1"'
        result = self._run(handle, ["sh", "-c", script, "sh", WORKSPACE, str(len(archive))], archive)
        if result.exit_code != 0:
            message = result.stderr.decode(errors="replace").strip()[-300:]
            raise SandboxUnavailableError(f"sandbox {handle.name} refused {what} (tar: {message})")

    def get_tree(
        self,
        handle: SandboxHandle,
        path: str,
        *,
        max_files: int = DEFAULT_MAX_TREE_FILES,
        max_bytes: int = DEFAULT_MAX_TREE_BYTES,
    ) -> Tree:
        """Stream ``tar -c`` of the folder out of the pod, keeping what ``TreeCollector`` keeps (the rest of the
        archive is read through, never held). A missing folder (or a link) gives an empty tree.

        Raises:
            SandboxError: ``path`` is not absolute or holds a NUL character.
            SandboxUnavailableError: the pod is gone, the stream broke, or the archive was broken.
        """
        if not path.startswith("/") or "\0" in path:
            raise SandboxError(f"cannot read {path!r}: give an absolute sandbox path, e.g. {WORKSPACE}/output")
        script = '[ -d "$1" ] && [ ! -L "$1" ] || exit 0; cd "$1" && exec tar -c -f - .'
        execution = k8s_client.PodExec(
            self.configuration, handle.name, self.namespace, ["sh", "-c", script, "sh", path], CONTAINER_NAME
        )
        collector = TreeCollector(max_files, max_bytes)
        try:
            reader = ChunkReader(execution.chunks(), limit=archive_budget(max_files, max_bytes))
            collect_tar(reader, collector, lambda name: name.removeprefix("./").strip("/"))
            tree = collector.tree()
            if tree.stopped_after is not None:
                return tree  # the rest is not read: closing the stream ends tar
            result = execution.finish()
        except tarfile.ReadError as exc:
            if reader.total == 0:  # the folder is missing: nothing was sent
                result = execution.finish()
                if result.exit_code == 0:
                    return Tree(max_files=max_files, max_bytes=max_bytes)
            raise SandboxUnavailableError(f"cannot read {path} from sandbox {handle.name}: {exc}") from exc
        except (tarfile.TarError, OSError) as exc:
            raise SandboxUnavailableError(f"cannot read {path} from sandbox {handle.name}: {exc}") from exc
        finally:
            execution.close()
        if result.exit_code != 0:
            message = result.stderr.decode(errors="replace").strip()[-300:]
            raise SandboxUnavailableError(f"cannot read {path} from sandbox {handle.name} (tar: {message})")
        return collector.tree()

    def stop(self, handle: SandboxHandle) -> None:
        """Delete the pod at once. Never raises, for a pod already gone neither."""
        with contextlib.suppress(SandboxStartError):
            k8s_client.delete_pod(self.core, handle.name, self.namespace)

    def reap(
        self,
        evaluation_id: str | None = None,
        older_than_s: float = 0.0,
        *,
        worker: str | None = None,
        purpose: SandboxPurpose = "session",
    ) -> list[str]:
        """Delete this project's pods of ``purpose`` (of one evaluation, or all; of one worker, or any's) created
        more than ``older_than_s`` seconds ago; return their names.

        Raises:
            SandboxStartError: no cluster configuration, or the pods could not be listed (what to do is said).
        """
        wanted = {PROJECT_LABEL: PROJECT, ROLE_LABEL: PURPOSE_ROLES[purpose], **reap_selector(evaluation_id, worker)}
        try:
            response = self.core.list_namespaced_pod(
                self.namespace,
                label_selector=label_selector(wanted),
                _preload_content=False,
                _request_timeout=k8s_client.DEFAULT_API_TIMEOUT_S,
            )
            pods = json.loads(response.data).get("items") or []
        except _ERRORS as exc:
            why = k8s_client.describe_api_error(exc, self.namespace, self.configuration.host)
            raise SandboxStartError(f"cannot list sandbox pods: {why}") from exc
        cutoff = time.time() - older_than_s
        removed = []
        for pod in pods:
            name = pod["metadata"]["name"]
            if created_epoch(pod["metadata"].get("creationTimestamp", "")) <= cutoff:
                k8s_client.delete_pod(self.core, name, self.namespace)
                removed.append(name)
        return removed
