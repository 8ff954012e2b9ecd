"""A client for one kernel behind a Jupyter Kernel Gateway: start it, run cells, interrupt, shut down.

Cells run over the gateway's websocket (``/api/kernels/<id>/channels``) in Jupyter Server's binary
``v1.kernel.websocket.jupyter.org`` protocol (``executor.wire``): the client asks for that subprotocol, and
only a server that does not agree to it gets the legacy JSON text frames. TCP_NODELAY is set on the client
side too, so a round trip costs the code's own time plus a few milliseconds.

Errors: an unreachable gateway, a dead kernel or closed channels raise ``SandboxUnavailableError``; a cell that
runs past its timeout is interrupted and comes back as an ``Execution`` with ``timed_out``.
"""

import contextlib
import json
import socket
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import websocket

from executor.output import CellOutput
from executor.probe import SNAPSHOT_EXPRESSION, ProbeReading, parse_reply, setup_code
from executor.wire import V1_SUBPROTOCOL, decode_v1, encode_v1
from services.errors import SandboxUnavailableError
from services.trajectory import Execution

DEFAULT_INTERRUPT_GRACE_S = 5.0
"""After interrupting a cell that timed out, how long to wait for it to stop before the kernel is restarted."""

DEFAULT_HTTP_TIMEOUT_S = 30.0
"""Timeout of the gateway's REST calls (start, interrupt, shutdown)."""

RESTART_RECOVERY_S = 60.0
"""After a restart, how long the restarted kernel may take to answer on reopened channels."""

PROBE_REPLY_TIMEOUT_S = 2.0
"""How long to wait, once a cell is idle, for its reply (which carries the telemetry) before going on without."""

_PROBE_KEY = "pbe"


class KernelClient:
    """One kernel in one kernel gateway. Not thread-safe: one session drives it."""

    def __init__(
        self, base_url: str, token: str, *, http: httpx.Client | None = None, probe_scope: str | None = "cgroup"
    ) -> None:
        """``probe_scope``: ``cgroup`` or ``process`` (see ``executor.probe``), or ``None`` for no telemetry."""
        self.base_url = base_url.rstrip("/")
        self.probe_scope = probe_scope
        self._probe_installed = False
        self._probe_in_metadata = False
        """The kernel reports the probe in each reply's metadata (the sandbox image's kernel class)."""
        self._last_reading: ProbeReading | None = None
        self._token = token
        self._http = http or httpx.Client(timeout=DEFAULT_HTTP_TIMEOUT_S)
        self._owns_http = http is None
        self._session = uuid.uuid4().hex
        self.kernel_id: str | None = None
        self._ws: websocket.WebSocket | None = None
        self._binary = False
        """Whether the channels speak the binary v1 protocol (else legacy JSON text frames)."""
        self._restarted = False
        """The kernel restarted since the channels were opened: reopen them before the next request."""

    @property
    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self._token}"}

    def start(self, kernel_name: str = "python3") -> str:
        """Start a kernel and open its channels.

        The kernel is started with an explicit empty environment: it gets PATH and the sandbox's own runtime
        settings (the gateway's allowlist), never the gateway's token or any other variable.

        Raises:
            SandboxUnavailableError: the gateway refused or did not answer.
        """
        try:
            response = self._http.post(
                f"{self.base_url}/api/kernels", json={"name": kernel_name, "env": {}}, headers=self._headers
            )
            response.raise_for_status()
            self.kernel_id = str(response.json()["id"])
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            raise SandboxUnavailableError(
                f"kernel gateway at {self.base_url} did not start a kernel: {exc}; is the sandbox running?"
            ) from exc
        self._connect()
        self._install_probe()
        return self.kernel_id

    def _connect(self) -> None:
        """Open (or reopen) the kernel's channels.

        Raises:
            SandboxUnavailableError: the gateway refused the websocket or did not answer.
        """
        if self._ws is not None:
            with contextlib.suppress(websocket.WebSocketException, OSError):
                self._ws.close()
            self._ws = None
        ws_url = "ws" + self.base_url[len("http") :] + f"/api/kernels/{self.kernel_id}/channels"
        try:
            self._ws = websocket.create_connection(
                ws_url,
                header=[f"Authorization: token {self._token}"],
                subprotocols=[V1_SUBPROTOCOL],
                skip_utf8_validation=True,  # text frames: json.loads validates; websocket-client's check is slow
                timeout=DEFAULT_HTTP_TIMEOUT_S,
                sockopt=((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),),
                enable_multithread=False,
            )
        except (websocket.WebSocketException, OSError) as exc:
            raise SandboxUnavailableError(
                f"kernel gateway at {self.base_url} did not open the kernel's channels: {exc}; is the sandbox running?"
            ) from exc
        self._binary = self._ws.getsubprotocol() == V1_SUBPROTOCOL

    def run_silent(
        self, code: str, timeout_s: float = DEFAULT_HTTP_TIMEOUT_S, *, require_iopub: bool = False
    ) -> dict[str, Any]:
        """Run ``code`` without history or output (setup, warm-up imports) and return its ``execute_reply``
        content (``status``, ``user_expressions``...). The probe is read too, so the next cell's CPU time
        does not include this code's. ``require_iopub``: also wait for the request's ``idle`` status, which
        comes on the output channel (proof that a cell's output will reach this client).

        Raises:
            SandboxUnavailableError: the kernel did not answer within ``timeout_s`` (with ``require_iopub``,
                its idle status did not come within ``PROBE_REPLY_TIMEOUT_S`` of the reply), or its channels
                closed.
        """
        if self._ws is None:
            raise SandboxUnavailableError("the kernel is not started; call start() first")
        request = self._execute_request(code, silent=True, user_expressions=self._probe_expressions())
        msg_id = request["header"]["msg_id"]
        deadline = time.monotonic() + timeout_s
        reply: dict[str, Any] | None = None
        idle = not require_iopub
        try:
            self._send(request)
            while reply is None or not idle:
                message = self._receive(deadline)
                if message is None:
                    channel = "its output channel" if reply is not None else "a setup request"
                    raise SandboxUnavailableError(f"the kernel did not answer on {channel} in time")
                if message.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                if _type(message) == "execute_reply":
                    self._read_probe(message)  # the next cell's CPU baseline
                    reply = dict(message.get("content", {}))
                    deadline = min(deadline, time.monotonic() + PROBE_REPLY_TIMEOUT_S)
                elif _type(message) == "status" and message.get("content", {}).get("execution_state") == "idle":
                    idle = True
            return reply
        except (websocket.WebSocketException, OSError) as exc:
            raise SandboxUnavailableError(f"lost the kernel's channels: {exc}") from exc

    def _probe_expressions(self) -> dict[str, str] | None:
        """The user expression that reads the probe, when the kernel does not report it by itself."""
        if self._probe_installed and not self._probe_in_metadata:
            return {_PROBE_KEY: SNAPSHOT_EXPRESSION}
        return None

    def _read_probe(self, reply: dict[str, Any]) -> ProbeReading | None:
        """Read the probe from an ``execute_reply``; a reading becomes the next cell's baseline."""
        if not self._probe_installed:
            return None
        reading, in_metadata = parse_reply(reply, _PROBE_KEY)
        self._probe_in_metadata = self._probe_in_metadata or in_metadata
        if reading is not None:
            self._last_reading = reading
        return reading

    def _install_probe(self) -> None:
        """Install the telemetry probe and take its first reading (the baseline of the first cell's CPU time)."""
        if self.probe_scope is None:
            return
        reply = self.run_silent(setup_code(self.probe_scope))
        self._probe_installed = reply.get("status") == "ok"
        if self._probe_installed:
            self.run_silent("")  # the first reading: the baseline of the first cell's CPU time

    def _receive(self, deadline: float) -> dict[str, Any] | None:
        """The next message on the channels, or ``None`` once ``deadline`` passes.

        Frames are read one at a time, control frames included: the server pings every 30 s, and a read that
        answered pings by itself would wait on past the deadline for as long as the pings keep coming.

        Raises:
            SandboxUnavailableError: the channels closed, or the gateway sent a malformed message.
        """
        assert self._ws is not None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self._ws.settimeout(max(0.01, remaining))
            try:
                opcode, frame = self._ws.recv_data_frame(control_frame=True)
            except websocket.WebSocketTimeoutException:
                continue
            if opcode in (websocket.ABNF.OPCODE_PING, websocket.ABNF.OPCODE_PONG):
                continue
            if opcode == websocket.ABNF.OPCODE_CLOSE:
                raise SandboxUnavailableError("the kernel's channels closed")
            raw = frame.data
            try:
                if opcode == websocket.ABNF.OPCODE_BINARY:
                    message: dict[str, Any] = decode_v1(raw)
                else:
                    message = json.loads(raw if isinstance(raw, str) else raw.decode("utf-8"))
            except (ValueError, UnicodeDecodeError, RecursionError) as exc:
                raise SandboxUnavailableError(f"the kernel gateway sent a malformed message: {exc}") from exc
            return shaped(message)

    def _send(self, message: dict[str, Any]) -> None:
        assert self._ws is not None
        if self._binary:
            self._ws.send(encode_v1(message), opcode=websocket.ABNF.OPCODE_BINARY)
        else:
            self._ws.send(json.dumps(message))

    def _execute_request(
        self, code: str, *, silent: bool, user_expressions: dict[str, str] | None = None
    ) -> dict[str, Any]:
        return self._message(
            "execute_request",
            {
                "code": code,
                "silent": silent,
                "store_history": not silent,
                "user_expressions": user_expressions or {},
                "allow_stdin": False,
                # False, so the probe queued behind a failing cell still runs.
                "stop_on_error": False,
            },
        )

    def _message(self, msg_type: str, content: dict[str, Any], channel: str = "shell") -> dict[str, Any]:
        return {
            "header": {
                "msg_id": uuid.uuid4().hex,
                "username": "pybench-eval",
                "session": self._session,
                "msg_type": msg_type,
                "version": "5.3",
                "date": datetime.now(UTC).isoformat(),
            },
            "parent_header": {},
            "metadata": {},
            "content": content,
            "channel": channel,
            "buffers": [],
        }

    def execute(self, code: str, timeout_s: float) -> tuple[Execution, CellOutput]:
        """Run one cell and collect its outputs and telemetry.

        Returns:
            The execution summary (with wall time, and CPU seconds and peak memory when the probe answered),
            and the cell's outputs in order (streams, results, images, the error).

        Raises:
            SandboxUnavailableError: the kernel died for good, would not restart, or its channels closed.

        A cell past ``timeout_s`` is interrupted; one that still runs ``DEFAULT_INTERRUPT_GRACE_S`` later gets
        its kernel restarted (``kernel_restarted``). A kernel that dies during the cell (the server restarts
        it) ends the cell with ``kernel_restarted``. The caller removes the sandbox when this raises.
        """
        if self._ws is None:
            raise SandboxUnavailableError("the kernel is not started; call start() first")
        if self._restarted:
            self._recover()
        if self.probe_scope is not None and not self._probe_installed:
            self._install_probe()  # after a restart the kernel lost it
        # The probe's reading comes with the cell's reply: in its metadata (the sandbox image's kernel), or as a
        # user expression (read only after a cell that succeeded; after a failed one, a silent request reads it).
        probing = self._probe_installed
        request = self._execute_request(code, silent=False, user_expressions=self._probe_expressions())
        msg_id = request["header"]["msg_id"]
        output = CellOutput()
        started = time.monotonic()
        deadline = started + timeout_s
        timed_out = restarted = idle = False
        reply: dict[str, Any] | None = None
        try:
            self._send(request)
            while not (idle and reply is not None):
                message = self._receive(deadline)
                if message is None:
                    if idle:  # the reply went missing: the output is complete, the telemetry is not
                        break
                    if timed_out:  # the interrupt did not stop it: restart the kernel, losing its state
                        self.restart()
                        restarted = True
                        break
                    timed_out = True
                    self.interrupt()
                    deadline = time.monotonic() + DEFAULT_INTERRUPT_GRACE_S
                    continue
                msg_type = _type(message)
                content = message.get("content", {})
                state = content.get("execution_state") if msg_type == "status" else None
                if state in ("restarting", "dead"):  # the kernel process died (the server says so to all)
                    if state == "dead":
                        raise SandboxUnavailableError("the kernel died during a cell and could not be restarted")
                    restarted = True
                    break
                if message.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                if state == "idle":
                    idle = True
                    deadline = min(deadline, time.monotonic() + PROBE_REPLY_TIMEOUT_S)
                elif msg_type == "execute_reply":
                    reply = message
                else:
                    output.add(msg_type, content)
            duration = time.monotonic() - started
            reading = None
            previous = self._last_reading
            if restarted:
                self._restarted = True
                self._probe_installed = self._probe_in_metadata = False
                self._last_reading = previous = None
            elif probing and reply is not None:
                reading = self._read_probe(reply)
                if reading is None and reply.get("content", {}).get("status") != "ok":
                    with contextlib.suppress(SandboxUnavailableError):  # the next cell finds out for sure
                        self.run_silent("", timeout_s=PROBE_REPLY_TIMEOUT_S)
                    reading = self._last_reading if self._last_reading is not previous else None
        except (websocket.WebSocketException, OSError) as exc:
            raise SandboxUnavailableError(f"lost the kernel's channels: {exc}") from exc
        cpu_s = None
        if reading is not None and previous is not None and reading.cpu_s is not None and previous.cpu_s is not None:
            cpu_s = max(0.0, reading.cpu_s - previous.cpu_s)
        execution = Execution(
            error_name=output.error[0] if output.error else None,
            error_value=output.error[1] if output.error else None,
            timed_out=timed_out,
            interrupted=timed_out and not restarted,
            kernel_restarted=restarted,
            truncated=output.dropped_chars > 0,
            duration_s=duration,
            cpu_s=cpu_s,
            peak_memory_mb=reading.peak_bytes / 2**20 if reading is not None else None,
            telemetry_scope=reading.scope if reading is not None else None,
        )
        return execution, output

    def _recover(self) -> None:
        """Reopen the channels after a restart and wait until the restarted kernel answers.

        The old channels may never reach the new kernel: the server restarts a kernel that dies soon after its
        start on new ports, and its existing websockets stay bound to the old ones (requests then vanish). So
        once the server reports the kernel out of its restart, a new websocket is opened under a new session
        (the server would otherwise replay to it what it buffered for the old one, a flood's output included).

        Raises:
            SandboxUnavailableError: the kernel did not answer within ``RESTART_RECOVERY_S``.
        """
        deadline = time.monotonic() + RESTART_RECOVERY_S
        while True:
            try:
                self._wait_until_settled(deadline)
                self._session = uuid.uuid4().hex
                self._connect()
                # The server checks a new connection's output channel only for a kernel it believes idle, and
                # a kernel restarted out of a busy cell may still look busy: wait for output to flow.
                self.run_silent("", timeout_s=min(10.0, max(1.0, deadline - time.monotonic())), require_iopub=True)
            except SandboxUnavailableError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)
                continue
            self._restarted = False
            return

    def _wait_until_settled(self, deadline: float) -> None:
        """Wait until the server reports the kernel neither starting nor restarting (or ``deadline`` passes).

        Raises:
            SandboxUnavailableError: the kernel is gone or dead.
        """
        while time.monotonic() < deadline:
            try:
                response = self._http.get(
                    f"{self.base_url}/api/kernels/{self.kernel_id}", headers=self._headers, timeout=5
                )
            except httpx.HTTPError:
                time.sleep(0.2)
                continue
            if response.status_code == 404:
                raise SandboxUnavailableError(f"kernel {self.kernel_id} is gone from its gateway")
            state = response.json().get("execution_state") if response.is_success else None
            if state == "dead":
                raise SandboxUnavailableError(f"kernel {self.kernel_id} died and was not restarted")
            if state not in (None, "starting", "restarting"):
                return
            time.sleep(0.1)

    def restart(self) -> None:
        """Restart the kernel (its state is lost).

        Raises:
            SandboxUnavailableError: the gateway could not restart it.
        """
        try:
            response = self._http.post(
                f"{self.base_url}/api/kernels/{self.kernel_id}/restart",
                headers=self._headers,
                timeout=DEFAULT_HTTP_TIMEOUT_S,
            )
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise SandboxUnavailableError(f"the kernel would not restart: {exc}") from exc

    def interrupt(self) -> None:
        """Interrupt the running cell (best effort)."""
        if self.kernel_id is None:
            return
        with contextlib.suppress(httpx.HTTPError):
            self._http.post(f"{self.base_url}/api/kernels/{self.kernel_id}/interrupt", headers=self._headers)

    def close(self, *, shutdown: bool = True) -> None:
        """Close the channels and, with ``shutdown``, ask the gateway to shut the kernel down (best effort). A
        caller that removes the sandbox next passes ``shutdown=False``: the removal ends the kernel anyway, and
        a shutdown would cost the gateway and the kernel their exit work (and the caller up to 5 s) for nothing.
        """
        if self._ws is not None:
            with contextlib.suppress(websocket.WebSocketException, OSError):
                self._ws.close()
            self._ws = None
        if self.kernel_id is not None and shutdown:
            with contextlib.suppress(httpx.HTTPError):
                self._http.delete(f"{self.base_url}/api/kernels/{self.kernel_id}", headers=self._headers, timeout=5)
        self.kernel_id = None
        if self._owns_http:
            self._http.close()


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def shaped(message: Any) -> dict[str, Any]:
    """``message`` in the shape the client reads, whatever it was: the model's own code can send any message on
    the kernel's channels (``get_ipython().kernel.session.send(...)``), so a field of the wrong type is dropped,
    never trusted. The header, parent header and content are objects; the fields this client reads have their
    types (a ``display_data`` whose ``data`` is text loses it; a traceback keeps only its text lines). Raises
    nothing."""
    message = _mapping(message)
    header, parent = _mapping(message.get("header")), _mapping(message.get("parent_header"))
    content = dict(_mapping(message.get("content")))
    msg_type = _text(message.get("msg_type")) or _text(header.get("msg_type"))
    if msg_type in ("display_data", "execute_result", "update_display_data"):
        content["data"] = {k: v for k, v in _mapping(content.get("data")).items() if isinstance(k, str)}
        content["metadata"] = _mapping(content.get("metadata"))
    elif msg_type == "stream":
        content["text"], content["name"] = _text(content.get("text")), _text(content.get("name")) or "stdout"
    elif msg_type == "error":
        traceback = content.get("traceback")
        content["traceback"] = (
            [line for line in traceback if isinstance(line, str)] if isinstance(traceback, list) else []
        )
        content["ename"], content["evalue"] = _text(content.get("ename")) or "Error", _text(content.get("evalue"))
    elif msg_type == "status":
        content["execution_state"] = _text(content.get("execution_state"))
    elif msg_type == "execute_reply":
        content["status"] = _text(content.get("status"))
        content["user_expressions"] = _mapping(content.get("user_expressions"))
    return {
        **message,
        "msg_type": msg_type,
        "header": header,
        "parent_header": parent,
        "content": content,
        "metadata": _mapping(message.get("metadata")),
    }


def _type(message: dict[str, Any]) -> str:
    return str(message.get("msg_type") or message.get("header", {}).get("msg_type", ""))
