"""A client for one kernel behind a Jupyter Kernel Gateway: start it, run cells, interrupt, shut down.

Cells run over the gateway's websocket (``/api/kernels/<id>/channels``, the JSON form of the Jupyter
messaging protocol) with TCP_NODELAY on the client side too, so a round trip costs the code's own time plus
a few milliseconds. Errors: an unreachable gateway or a dead kernel raises ``SandboxUnavailableError``; a cell
that runs past its timeout is interrupted and comes back as an ``Execution`` with ``timed_out``.
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
from services.errors import SandboxUnavailableError
from services.trajectory import Execution

DEFAULT_INTERRUPT_GRACE_S = 10.0
"""After interrupting a cell that timed out, how long to wait for the kernel to become idle again."""

DEFAULT_HTTP_TIMEOUT_S = 30.0
"""Timeout of the gateway's REST calls (start, interrupt, shutdown)."""


class KernelClient:
    """One kernel in one kernel gateway. Not thread-safe: one session drives it."""

    def __init__(self, base_url: str, token: str, *, http: httpx.Client | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._token = token
        self._http = http or httpx.Client(timeout=DEFAULT_HTTP_TIMEOUT_S)
        self._owns_http = http is None
        self._session = uuid.uuid4().hex
        self.kernel_id: str | None = None
        self._ws: websocket.WebSocket | None = None

    @property
    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self._token}"}

    def start(self, kernel_name: str = "python3") -> str:
        """Start a kernel and open its channels.

        Raises:
            SandboxUnavailableError: the gateway refused or did not answer.
        """
        try:
            response = self._http.post(
                f"{self.base_url}/api/kernels", json={"name": kernel_name}, headers=self._headers
            )
            response.raise_for_status()
            self.kernel_id = str(response.json()["id"])
            ws_url = "ws" + self.base_url[len("http") :] + f"/api/kernels/{self.kernel_id}/channels"
            self._ws = websocket.create_connection(
                ws_url,
                header=[f"Authorization: token {self._token}"],
                timeout=DEFAULT_HTTP_TIMEOUT_S,
                sockopt=((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),),
                enable_multithread=False,
            )
        except (httpx.HTTPError, KeyError, ValueError, websocket.WebSocketException, OSError) as exc:
            raise SandboxUnavailableError(
                f"kernel gateway at {self.base_url} did not start a kernel: {exc}; is the sandbox running?"
            ) from exc
        return self.kernel_id

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
        """Run one cell and collect its outputs.

        Returns:
            The execution summary, and the cell's outputs in order (streams, results, images, the error).

        Raises:
            SandboxUnavailableError: the kernel died or its channels closed.
        """
        if self._ws is None:
            raise SandboxUnavailableError("the kernel is not started; call start() first")
        request = self._message(
            "execute_request",
            {
                "code": code,
                "silent": False,
                "store_history": True,
                "user_expressions": {},
                "allow_stdin": False,
                "stop_on_error": True,
            },
        )
        msg_id = request["header"]["msg_id"]
        output = CellOutput()
        started = time.monotonic()
        deadline = started + timeout_s
        timed_out = False
        try:
            self._ws.send(json.dumps(request))
            while True:
                now = time.monotonic()
                if not timed_out and now >= deadline:
                    timed_out = True
                    self.interrupt()
                    deadline = now + DEFAULT_INTERRUPT_GRACE_S
                elif timed_out and now >= deadline:
                    raise SandboxUnavailableError(
                        f"the kernel did not stop {DEFAULT_INTERRUPT_GRACE_S:.0f} s after an interrupt"
                    )
                self._ws.settimeout(max(0.01, deadline - now))
                try:
                    raw = self._ws.recv()
                except websocket.WebSocketTimeoutException:
                    continue
                if not raw:
                    raise SandboxUnavailableError("the kernel's channels closed during a cell")
                message = json.loads(raw)
                if message.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                msg_type = message.get("msg_type") or message["header"]["msg_type"]
                content = message.get("content", {})
                if msg_type == "status" and content.get("execution_state") == "idle":
                    break
                if msg_type == "status" and content.get("execution_state") == "dead":
                    raise SandboxUnavailableError("the kernel died during a cell")
                output.add(msg_type, content)
        except (websocket.WebSocketException, OSError) as exc:
            raise SandboxUnavailableError(f"lost the kernel's channels: {exc}") from exc
        execution = Execution(
            error_name=output.error[0] if output.error else None,
            error_value=output.error[1] if output.error else None,
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
        )
        return execution, output

    def interrupt(self) -> None:
        """Interrupt the running cell (best effort)."""
        if self.kernel_id is None:
            return
        with contextlib.suppress(httpx.HTTPError):
            self._http.post(f"{self.base_url}/api/kernels/{self.kernel_id}/interrupt", headers=self._headers)

    def close(self) -> None:
        """Close the channels and shut the kernel down (best effort: the sandbox is removed anyway)."""
        if self._ws is not None:
            with contextlib.suppress(websocket.WebSocketException, OSError):
                self._ws.close()
            self._ws = None
        if self.kernel_id is not None:
            with contextlib.suppress(httpx.HTTPError):
                self._http.delete(f"{self.base_url}/api/kernels/{self.kernel_id}", headers=self._headers, timeout=5)
            self.kernel_id = None
        if self._owns_http:
            self._http.close()
