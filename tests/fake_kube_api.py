"""A FAKE Kubernetes API server for the tests of the kubernetes sandbox backends (there is no cluster here).

It serves, on 127.0.0.1, the few pod routes of the core v1 API the backends use, records every request, and
plays pod phases:

* ``POST .../pods``: a pod is stored ``Pending``; ``pending_s`` later it is ``Running`` with ``podIP``
  127.0.0.1 (or ``Failed``, with a terminated container, when ``fail_pods`` says so). ``dryRun=All``
  answers without storing. A namespace in ``forbidden`` answers 403, one not in ``namespaces`` 404.
* ``GET .../pods/<name>``, ``DELETE`` (the pod is gone at once: later calls answer 404), ``GET .../pods``
  with ``labelSelector`` (equality terms) and ``fieldSelector=metadata.name=...``, and ``watch=true``, which
  streams ``ADDED``/``MODIFIED``/``DELETED`` events after a ``resourceVersion``; ``drop_watches`` cuts that
  many watches mid-stream (half an event, then the connection is aborted).
* ``.../pods/<name>/exec`` over WebSocket (``v4.channel.k8s.io``: channel 0 stdin, 1 stdout, 2 stderr, 3 the
  exit status): the command really runs, as a subprocess of the test, against the pod's own temporary
  folder. Absolute sandbox paths in its arguments and environment (``/workspace``, ``/grading``, ``/tmp``,
  ``/home/sandbox``) are rewritten to the pod's folder, and ``/opt/venv/bin/python`` to the test's Python, so
  files really go in and out. A pod that is gone refuses the upgrade with 404.

A pod that declares a container port plays the sandbox image's program: a real kernel gateway
(``jupyter_kernel_gateway``, as ``services.sandbox.local`` starts it) with the pod's ``KG_AUTH_TOKEN``, in the
pod's workspace, on a free port of 127.0.0.1 that ``gateway_port(name)`` tells (the backend under test takes it
as its test-only port override: every fake pod shares the address 127.0.0.1).
"""

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from services.sandbox.local import DEFAULT_CONFIG_FILE, DEFAULT_GATEWAY_COMMAND
from tests.servers import free_port

SANDBOX_PATHS = ("/workspace", "/grading", "/tmp", "/home/sandbox")
"""The absolute paths of a sandbox pod that the fake maps into the pod's folder."""

SANDBOX_PYTHON = "/opt/venv/bin/python"


@dataclass
class RecordedRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any = None


@dataclass
class FakePod:
    manifest: dict[str, Any]
    folder: Path
    gateway: "subprocess.Popen[bytes] | None" = None
    gateway_port: int | None = None
    events: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)
    execs: list[int] = field(default_factory=list)
    """Process ids of the commands exec'd in it (killed, with their groups, when the pod is deleted)."""


def _status(code: int, reason: str, message: str) -> JSONResponse:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason}
    return JSONResponse({**body, "code": code}, status_code=code)


def _matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


class FakeKubeAPI:
    """The FAKE Kubernetes API server (see the module docstring); ``with FakeKubeAPI(root) as api:`` serves it."""

    def __init__(
        self,
        root: Path,
        *,
        namespaces: tuple[str, ...] = ("pybench-eval-sandboxes",),
        forbidden: tuple[str, ...] = ("forbidden-sandboxes",),
        pending_s: float = 0.3,
    ) -> None:
        self.root = root
        self.namespaces = set(namespaces)
        self.forbidden = set(forbidden)
        self.pending_s = pending_s
        self.fail_pods: dict[str, str] = {}
        """Pod name prefix -> the message of the failure the pod ends in instead of running."""
        self.drop_watches = 0
        """How many of the next watches are cut mid-stream."""
        self.requests: list[RecordedRequest] = []
        self.pods: dict[tuple[str, str], FakePod] = {}
        self.gone: dict[tuple[str, str], FakePod] = {}
        self._lock = threading.RLock()
        self._versions = itertools.count(100)
        self.url = ""
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    # -- serving ---------------------------------------------------------------------------------------------

    def __enter__(self) -> "FakeKubeAPI":
        pods = "/api/v1/namespaces/{namespace}/pods"
        app = Starlette(
            routes=[
                Route(pods, self._pods, methods=["GET", "POST"]),
                Route(pods + "/{name}", self._pod, methods=["GET", "DELETE"]),
                WebSocketRoute(pods + "/{name}/exec", self._exec),
            ]
        )
        port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off", ws="wsproto")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the fake Kubernetes API server on port {port} did not start")
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *_: object) -> None:
        for pod in [*self.pods.values(), *self.gone.values()]:
            self._stop_gateway(pod)
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def gateway_port(self, name: str) -> int:
        """The port of the kernel gateway that plays the pod ``name``'s program."""
        with self._lock:
            for (_, pod_name), pod in self.pods.items():
                if pod_name == name and pod.gateway_port is not None:
                    return pod.gateway_port
        raise KeyError(f"fake pod {name} has no kernel gateway")

    def requests_to(self, method: str, suffix: str = "") -> list[RecordedRequest]:
        return [r for r in self.requests if r.method == method and r.path.endswith(suffix)]

    def created(self) -> list[dict[str, Any]]:
        """The pod manifests sent, as sent (dry runs too)."""
        return [r.body for r in self.requests if r.method == "POST" and r.body is not None]

    def folder_of(self, name: str) -> Path:
        with self._lock:
            for (_, pod_name), pod in [*self.pods.items(), *self.gone.items()]:
                if pod_name == name:
                    return pod.folder
        raise KeyError(name)

    def pod_names(self, namespace: str = "pybench-eval-sandboxes") -> list[str]:
        with self._lock:
            return sorted(name for ns, name in self.pods if ns == namespace)

    def add_pod(self, namespace: str, manifest: dict[str, Any], created: datetime) -> None:
        """Store a pod as if created at ``created`` (an old leftover for reap tests), already running."""
        with self._lock:
            pod = self._store(namespace, manifest)
            pod.manifest["metadata"]["creationTimestamp"] = created.strftime("%Y-%m-%dT%H:%M:%SZ")
            self._set_phase(pod, "Running", podIP="127.0.0.1")

    # -- routes ----------------------------------------------------------------------------------------------

    async def _record(self, request: Request) -> Any:
        body = None
        raw = await request.body()
        if raw:
            body = json.loads(raw)
        query: dict[str, list[str]] = {}
        for key, value in request.query_params.multi_items():
            query.setdefault(key, []).append(value)
        with self._lock:
            self.requests.append(RecordedRequest(request.method, request.url.path, query, body))
        return body

    def _refused(self, namespace: str, verb: str) -> Response | None:
        if namespace in self.forbidden:
            return _status(
                403,
                "Forbidden",
                f'pods is forbidden: User "system:serviceaccount:pybench-eval:executor" cannot {verb} resource '
                f'"pods" in API group "" in the namespace "{namespace}"',
            )
        return None

    async def _pods(self, request: Request) -> Response:
        body = await self._record(request)
        namespace = request.path_params["namespace"]
        verb = "create" if request.method == "POST" else "list"
        refused = self._refused(namespace, verb)
        if refused is not None:
            return refused
        if request.method == "POST":
            if namespace not in self.namespaces:
                return _status(404, "NotFound", f'namespaces "{namespace}" not found')
            if request.query_params.get("dryRun") == "All":
                return JSONResponse(body, status_code=201)
            with self._lock:
                if (namespace, body["metadata"]["name"]) in self.pods:
                    return _status(409, "AlreadyExists", f'pods "{body["metadata"]["name"]}" already exists')
                pod = self._store(namespace, body)
                threading.Thread(target=self._play, args=(namespace, pod), daemon=True).start()
                return JSONResponse(pod.manifest, status_code=201)
        labels = request.query_params.get("labelSelector", "")
        fields = request.query_params.get("fieldSelector", "")
        name = fields.removeprefix("metadata.name=") if fields else None
        if request.query_params.get("watch", "").lower() in ("true", "1"):
            return StreamingResponse(self._watch(namespace, labels, name, request), media_type="application/json")
        with self._lock:
            items = [
                pod.manifest
                for (ns, pod_name), pod in sorted(self.pods.items())
                if ns == namespace
                and _matches(pod.manifest["metadata"].get("labels", {}), labels)
                and (name is None or pod_name == name)
            ]
            version = str(next(self._versions))
        limit = int(request.query_params.get("limit", "0") or 0)
        items = items[:limit] if limit else items
        return JSONResponse(
            {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": version}, "items": items}
        )

    async def _pod(self, request: Request) -> Response:
        await self._record(request)
        namespace, name = request.path_params["namespace"], request.path_params["name"]
        refused = self._refused(namespace, "get" if request.method == "GET" else "delete")
        if refused is not None:
            return refused
        with self._lock:
            pod = self.pods.get((namespace, name))
            if pod is None:
                return _status(404, "NotFound", f'pods "{name}" not found')
            if request.method == "GET":
                return JSONResponse(pod.manifest)
            del self.pods[(namespace, name)]
            self.gone[(namespace, name)] = pod
            pod.manifest["metadata"]["deletionTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            self._event(pod, "DELETED")
            manifest = pod.manifest
        self._stop_gateway(pod)
        for pid in pod.execs:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        shutil.rmtree(pod.folder, ignore_errors=True)
        return JSONResponse(manifest)

    async def _watch(self, namespace: str, labels: str, name: str | None, request: Request) -> AsyncIterator[bytes]:
        since = int(request.query_params.get("resourceVersion", "0") or 0)
        timeout = float(request.query_params.get("timeoutSeconds", "30"))
        with self._lock:
            drop = self.drop_watches > 0
            self.drop_watches -= 1 if drop else 0
        if drop:
            yield b'{"type": "MODIFIED", "object": {"kind": "Po'
            await asyncio.sleep(0.05)
            raise ConnectionAbortedError("the fake API server cuts this watch")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                pods = [*self.pods.items(), *self.gone.items()]
                events = [
                    (version, kind, manifest)
                    for (ns, pod_name), pod in pods
                    if ns == namespace and (name is None or pod_name == name)
                    for version, kind, manifest in pod.events
                    if version > since and _matches(manifest["metadata"].get("labels", {}), labels)
                ]
            for version, kind, manifest in sorted(events, key=lambda event: event[0]):
                since = version
                yield (json.dumps({"type": kind, "object": manifest}) + "\n").encode()
            await asyncio.sleep(0.05)

    # -- pod phases ------------------------------------------------------------------------------------------

    def _store(self, namespace: str, manifest: dict[str, Any]) -> FakePod:
        name = manifest["metadata"]["name"]
        folder = self.root / namespace / name
        for path in SANDBOX_PATHS:
            (folder / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
        manifest = json.loads(json.dumps(manifest))
        manifest["metadata"].update(
            {
                "namespace": namespace,
                "uid": str(uuid.uuid4()),
                "creationTimestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        )
        manifest["status"] = {"phase": "Pending"}
        pod = FakePod(manifest=manifest, folder=folder)
        self.pods[(namespace, name)] = pod
        self._event(pod, "ADDED")
        return pod

    def _event(self, pod: FakePod, kind: str) -> None:
        version = next(self._versions)
        pod.manifest["metadata"]["resourceVersion"] = str(version)
        pod.events.append((version, kind, json.loads(json.dumps(pod.manifest))))

    def _set_phase(self, pod: FakePod, phase: str, **status: Any) -> None:
        pod.manifest["status"] = {"phase": phase, **status}
        self._event(pod, "MODIFIED")

    def _play(self, namespace: str, pod: FakePod) -> None:
        time.sleep(self.pending_s)
        name = pod.manifest["metadata"]["name"]
        failure = next((why for prefix, why in self.fail_pods.items() if name.startswith(prefix)), None)
        with self._lock:
            if self.pods.get((namespace, name)) is not pod:
                return
            if failure is not None:
                terminated = {"exitCode": 1, "reason": "Error", "message": failure}
                self._set_phase(
                    pod,
                    "Failed",
                    containerStatuses=[{"name": "sandbox", "state": {"terminated": terminated}}],
                )
                return
            container = pod.manifest["spec"]["containers"][0]
            if container.get("ports"):
                self._start_gateway(pod, container)
            self._set_phase(pod, "Running", podIP="127.0.0.1")

    def _environment(self, pod: FakePod, container: dict[str, Any]) -> dict[str, str]:
        env = {
            "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", os.defpath),
            "HOME": str(pod.folder / "home/sandbox"),
            "LANG": "C.UTF-8",
            "JUPYTER_RUNTIME_DIR": str(pod.folder / "tmp/jupyter-runtime"),
        }
        for item in container.get("env", []):
            env[item["name"]] = self._map(pod, item["value"])
        return env

    def _start_gateway(self, pod: FakePod, container: dict[str, Any]) -> None:
        port = free_port()
        (pod.folder / "workspace/data").mkdir(exist_ok=True)
        (pod.folder / "workspace/output").mkdir(exist_ok=True)
        with open(pod.folder / "gateway.log", "wb") as log:
            pod.gateway = subprocess.Popen(
                [
                    *DEFAULT_GATEWAY_COMMAND,
                    f"--config={DEFAULT_CONFIG_FILE}",
                    "--KernelGatewayApp.ip=127.0.0.1",
                    f"--KernelGatewayApp.port={port}",
                    "--KernelGatewayApp.port_retries=0",
                ],
                cwd=pod.folder / "workspace",
                env=self._environment(pod, container),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        pod.gateway_port = port

    def _stop_gateway(self, pod: FakePod) -> None:
        if pod.gateway is not None and pod.gateway.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(pod.gateway.pid, signal.SIGKILL)
            pod.gateway.wait(timeout=10)

    # -- exec ------------------------------------------------------------------------------------------------

    def _map(self, pod: FakePod, value: str) -> str:
        if value == SANDBOX_PYTHON:
            return sys.executable
        for path in SANDBOX_PATHS:
            if value == path or value.startswith(path + "/"):
                return str(pod.folder) + value
        return value

    async def _exec(self, websocket: WebSocket) -> None:
        namespace, name = websocket.path_params["namespace"], websocket.path_params["name"]
        query: dict[str, list[str]] = {}
        for key, value in websocket.query_params.multi_items():
            query.setdefault(key, []).append(value)
        with self._lock:
            self.requests.append(RecordedRequest("EXEC", websocket.url.path, query))
            pod = self.pods.get((namespace, name))
        if pod is None or namespace in self.forbidden:
            code = 403 if namespace in self.forbidden else 404
            await websocket.send_denial_response(_status(code, "NotFound", f'pods "{name}" not found'))
            return
        await websocket.accept(subprotocol="v4.channel.k8s.io")
        container = pod.manifest["spec"]["containers"][0]
        command = [self._map(pod, part) for part in query.get("command", [])]
        process = await asyncio.create_subprocess_exec(
            *command,
            cwd=pod.folder / "workspace",
            env=self._environment(pod, container),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        assert process.stdin is not None and process.stdout is not None and process.stderr is not None
        pod.execs.append(process.pid)

        async def pump(source: asyncio.StreamReader, channel: int) -> None:
            while chunk := await source.read(65536):
                await websocket.send_bytes(bytes([channel]) + chunk)

        async def feed() -> None:
            assert process.stdin is not None
            with contextlib.suppress(WebSocketDisconnect, ConnectionError, RuntimeError):
                while True:
                    message = await websocket.receive_bytes()
                    if message[:1] == b"\x00" and len(message) > 1:
                        process.stdin.write(message[1:])
                        await process.stdin.drain()

        feeder = asyncio.create_task(feed())
        try:
            await asyncio.gather(pump(process.stdout, 1), pump(process.stderr, 2))
            code = await process.wait()
        except (WebSocketDisconnect, ConnectionError, RuntimeError):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
            return
        finally:
            feeder.cancel()
        if code == 0:
            status: dict[str, Any] = {"metadata": {}, "status": "Success"}
        else:
            status = {
                "metadata": {},
                "status": "Failure",
                "message": f"command terminated with non-zero exit code: {code}",
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
            }
        with contextlib.suppress(Exception):
            await websocket.send_bytes(b"\x03" + json.dumps(status).encode())
            await websocket.close()


@contextlib.contextmanager
def fake_kube_api(root: Path, **options: Any) -> Iterator[FakeKubeAPI]:
    """Serve a FAKE Kubernetes API server for the block (see ``FakeKubeAPI``)."""
    with FakeKubeAPI(root, **options) as api:
        yield api
