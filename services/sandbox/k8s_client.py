"""What the executor's and the grader's Kubernetes sandboxes share of the official ``kubernetes`` client: loading
the cluster's configuration, waiting for a pod to run (with a watch that survives drops), running a command in a
pod over the ``pods/exec`` stream (stdin in, stdout out, exit status), deleting a pod, and saying in words what
an API error means. Only the two Kubernetes modules import this one (the client is a heavy SDK).

Errors: library errors are translated here into ``SandboxStartError`` (while a pod starts) and
``SandboxUnavailableError`` (a pod gone or unreachable afterwards), raised ``from`` the original.

Every exec call uses an API client of its own: ``kubernetes.stream.stream`` swaps the request method of the
client it is given for the duration of the call, which would send another thread's REST call over a websocket.
"""

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException
from kubernetes.stream import stream

from services.errors import SandboxStartError, SandboxUnavailableError

DEFAULT_WATCH_S = 30
"""How long one watch request lasts before it is made again (a watch that drops is made again at once)."""

DEFAULT_API_TIMEOUT_S = 10.0
"""The timeout of one plain API request (create, get, list, delete)."""

STDIN_CHUNK = 256 * 1024
"""The most bytes one websocket frame of stdin carries."""

STDOUT, STDERR, ERROR = 1, 2, 3
"""The channels of the ``v4.channel.k8s.io`` exec protocol that come back (0, stdin, goes in)."""

FATAL_WAITING_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError"}
)
"""Why a container waits that never mends by itself: the pod is given up at once."""

TRANSIENT_ERRORS = (urllib3.exceptions.HTTPError, OSError, ValueError)
"""What a dropped connection or a cut watch raises below the client (``ValueError``: a half-read JSON line)."""


def load_configuration() -> client.Configuration:
    """The cluster's configuration: the service account's inside a pod, else ``KUBECONFIG`` (or ~/.kube/config).

    Raises:
        SandboxStartError: neither is there or readable; the message says what to set.
    """
    configuration = client.Configuration()
    try:
        if "KUBERNETES_SERVICE_HOST" in os.environ:
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(client_configuration=configuration)
    except (config.ConfigException, OSError, TypeError, ValueError) as exc:
        raise SandboxStartError(
            f"no Kubernetes configuration ({exc}): run inside the cluster with a service account, or set KUBECONFIG"
        ) from exc
    return configuration


def describe_api_error(exc: BaseException, namespace: str, host: str) -> str:
    """What an API error means for sandboxes in ``namespace``, in words that say what to do."""
    if isinstance(exc, ApiException) and exc.status:
        message = _api_message(exc)
        if exc.status == 401:
            return f"the Kubernetes API at {host} refused the credentials ({message}): check KUBECONFIG's user"
        if exc.status == 403:
            return (
                f"forbidden in namespace {namespace} ({message}): give this service account the pods and pods/exec "
                f"rights of k8s/ in {namespace}, or set PBE_K8S_NAMESPACE to the sandboxes' namespace"
            )
        if exc.status == 404:
            return (
                f"namespace {namespace} does not exist ({message}): apply the manifests (kubectl apply -k "
                "k8s/overlays/<name>) or set PBE_K8S_NAMESPACE to the sandboxes' namespace"
            )
        return f"the Kubernetes API at {host} answered {exc.status} ({message})"
    reason = exc.reason if isinstance(exc, ApiException) else exc
    return f"cannot reach the Kubernetes API at {host} ({reason}): check KUBECONFIG, or that the cluster is up"


def _api_message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
    except ValueError:
        body = {}
    return str(body.get("message") or exc.reason or "no message")[:300]


def delete_pod(core: client.CoreV1Api, name: str, namespace: str) -> bool:
    """Delete the pod ``name`` at once. Best effort: never raises.

    Returns:
        True when it was there and is being deleted; False when it was gone or the API failed.
    """
    try:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0, _request_timeout=DEFAULT_API_TIMEOUT_S)
    except (ApiException, *TRANSIENT_ERRORS):
        return False
    return True


def _pod_failure(pod: Any) -> str | None:
    """Why a pod will never run, or None while it may."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    if phase in ("Failed", "Succeeded"):
        why = status.get("message") or status.get("reason") or f"phase {phase}"
        for state in status.get("containerStatuses") or []:
            terminated = (state.get("state") or {}).get("terminated")
            if terminated:
                detail = terminated.get("message") or terminated.get("reason") or ""
                why += f"; its container ended with exit code {terminated.get('exitCode')} {detail}".rstrip()
        return f"it ended ({why})"
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return "it was deleted"
    for state in status.get("containerStatuses") or []:
        waiting = (state.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in FATAL_WAITING_REASONS:
            return (
                f"its container cannot start ({waiting['reason']}: {waiting.get('message', '')}): is the image in "
                "the cluster (kind load docker-image, or a registry the nodes reach) and PBE_SANDBOX_IMAGE right?"
            )
    return None


def wait_running(core: client.CoreV1Api, name: str, namespace: str, deadline: float) -> dict[str, Any]:
    """Wait until the pod ``name`` runs with an address, watching it; a watch that drops or ends is followed by a
    fresh read of the pod and a new watch from there.

    Returns:
        The running pod (as the API's JSON).

    Raises:
        SandboxStartError: the pod failed, ended, was deleted or cannot pull its image; or ``deadline``
            (``time.monotonic()``) passed; or the API stayed unreachable until then.
    """
    last_error = "no answer"
    while time.monotonic() < deadline:
        try:
            pod = _read(core, name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                raise SandboxStartError(f"sandbox pod {name} did not start: it was deleted") from exc
            last_error = str(exc.reason)
            time.sleep(0.2)
            continue
        except TRANSIENT_ERRORS as exc:
            last_error = str(exc)
            time.sleep(0.2)
            continue
        while True:
            failure = _pod_failure(pod)
            if failure is not None:
                raise SandboxStartError(f"sandbox pod {name} did not start: {failure}")
            status = pod.get("status") or {}
            if status.get("phase") == "Running" and status.get("podIP"):
                return pod
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                event = _next_event(core, name, namespace, pod["metadata"]["resourceVersion"], remaining)
            except (ApiException, *TRANSIENT_ERRORS) as exc:
                last_error = f"watch dropped: {exc}"
                break  # read the pod again, then watch from where it is
            if event is None:
                break
            kind, pod = event
            if kind == "DELETED":
                raise SandboxStartError(f"sandbox pod {name} did not start: it was deleted")
    raise SandboxStartError(f"sandbox pod {name} was not running in time ({last_error})")


def _read(core: client.CoreV1Api, name: str, namespace: str) -> dict[str, Any]:
    response = core.read_namespaced_pod(name, namespace, _preload_content=False, _request_timeout=DEFAULT_API_TIMEOUT_S)
    pod: dict[str, Any] = json.loads(response.data)
    return pod


def _next_event(
    core: client.CoreV1Api, name: str, namespace: str, resource_version: str, remaining_s: float
) -> tuple[str, dict[str, Any]] | None:
    """The next change of the pod after ``resource_version``; None when the watch ended without one."""
    seconds = max(1, min(DEFAULT_WATCH_S, int(remaining_s) + 1))
    watcher = watch.Watch()
    try:
        for event in watcher.stream(
            core.list_namespaced_pod,
            namespace,
            field_selector=f"metadata.name={name}",
            resource_version=resource_version,
            timeout_seconds=seconds,
            _request_timeout=seconds + 5,
        ):
            raw = event.get("raw_object") or {}
            if event.get("type") in ("ADDED", "MODIFIED", "DELETED") and raw.get("metadata", {}).get("name") == name:
                return str(event["type"]), raw
    finally:
        watcher.stop()
    return None


@dataclass
class ExecResult:
    """How an exec'd command ended."""

    exit_code: int
    stderr: bytes


class PodExec:
    """One command running in a pod over the exec stream: ``send`` stdin, read stdout as a file, ``finish``.

    Raises (from the constructor):
        SandboxUnavailableError: the pod is gone, or the stream could not be opened.
    """

    def __init__(
        self, configuration: client.Configuration, name: str, namespace: str, command: list[str], container: str
    ) -> None:
        self.name = name
        core = client.CoreV1Api(client.ApiClient(configuration))
        try:
            self._ws: Any = stream(
                core.connect_get_namespaced_pod_exec,
                name,
                namespace,
                command=command,
                container=container,
                stdin=True,
                stdout=True,
                stderr=True,
                tty=False,
                binary=True,
                _preload_content=False,
            )
        except (ApiException, *TRANSIENT_ERRORS) as exc:
            reason = exc.reason if isinstance(exc, ApiException) else exc
            gone = "404" in str(reason)
            raise SandboxUnavailableError(
                f"sandbox pod {name} is gone" if gone else f"cannot run a command in sandbox pod {name}: {reason}"
            ) from exc
        self._stdout = b""
        self._stderr = b""
        self._error = b""

    def send(self, data: bytes) -> None:
        """Write ``data`` to the command's stdin.

        Raises:
            SandboxUnavailableError: the stream broke.
        """
        try:
            for start in range(0, len(data), STDIN_CHUNK):
                self._ws.write_stdin(data[start : start + STDIN_CHUNK])
        except Exception as exc:  # websocket-client raises its own exceptions and OSError
            self.close()
            raise SandboxUnavailableError(f"lost the exec stream of sandbox pod {self.name}: {exc}") from exc

    def _pump(self, timeout_s: float | None) -> bool:
        """Take at most one frame; False when the stream is closed."""
        if not self._ws.is_open():
            return False
        try:
            self._ws.update(timeout=timeout_s)
        except Exception as exc:  # a connection reset below websocket-client
            self.close()
            raise SandboxUnavailableError(f"lost the exec stream of sandbox pod {self.name}: {exc}") from exc
        # The client's read_channel reads another frame when the channel is empty (and its copy of every frame
        # grows without end): take what the one frame brought straight from its buffers, then drop the copy.
        channels = self._ws._channels
        self._stdout += bytes(channels.pop(STDOUT, b""))
        self._stderr = (self._stderr + bytes(channels.pop(STDERR, b"")))[-8192:]
        self._error += bytes(channels.pop(ERROR, b""))
        self._ws.read_all()
        return True

    def chunks(self, deadline: float | None = None) -> Iterator[bytes]:
        """Stdout as it arrives, until the command ends.

        Raises:
            TimeoutError: ``deadline`` (``time.monotonic()``) passed first.
            SandboxUnavailableError: the stream broke.
        """
        while True:
            if self._stdout:
                data, self._stdout = self._stdout, b""
                yield data
                continue
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"the command in sandbox pod {self.name} did not end in time")
            wait = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
            if not self._pump(wait):
                if self._stdout:
                    continue
                return

    def finish(self, deadline: float | None = None) -> ExecResult:
        """Read to the end (stdout dropped) and return how the command ended.

        Raises:
            TimeoutError: ``deadline`` passed first.
            SandboxUnavailableError: the stream broke, or it closed without an exit status (the pod went away).
        """
        for _ in self.chunks(deadline):
            pass
        self.close()
        return ExecResult(self._exit_code(), self._stderr)

    def _exit_code(self) -> int:
        if not self._error:
            raise SandboxUnavailableError(f"sandbox pod {self.name} went away while a command ran in it")
        try:
            status = json.loads(self._error)
        except ValueError as exc:
            raise SandboxUnavailableError(f"sandbox pod {self.name} sent a garbled exit status") from exc
        if status.get("status") == "Success":
            return 0
        for cause in (status.get("details") or {}).get("causes") or []:
            if cause.get("reason") == "ExitCode":
                return int(cause.get("message", "1"))
        raise SandboxUnavailableError(f"the command in sandbox pod {self.name} failed: {status.get('message')}")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._ws.close()


def run_in_pod(
    configuration: client.Configuration,
    name: str,
    namespace: str,
    command: list[str],
    container: str,
    stdin: bytes = b"",
    *,
    deadline: float | None = None,
    on_stdout: Callable[[bytes], None] | None = None,
) -> ExecResult:
    """Run ``command`` in the pod, feeding it ``stdin``, handing stdout to ``on_stdout`` as it arrives.

    Raises:
        TimeoutError: ``deadline`` (``time.monotonic()``) passed before it ended.
        SandboxUnavailableError: the pod is gone or the stream broke.
    """
    execution = PodExec(configuration, name, namespace, command, container)
    try:
        if stdin:
            execution.send(stdin)
        for chunk in execution.chunks(deadline):
            if on_stdout is not None:
                on_stdout(chunk)
        return execution.finish(deadline)
    finally:
        execution.close()
