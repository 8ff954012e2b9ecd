"""A small client of the gateway's REST API (used by the demo, the end-to-end tests and, later, the CLI).

Errors: ``GatewayError`` for an answer that is not a success, with the problem document's detail.
"""

import time
from typing import Any

import httpx

from services.errors import PybenchEvalError

DEFAULT_POLL_S = 1.0
"""How often ``wait`` asks for progress."""


class GatewayError(PybenchEvalError):
    """The gateway answered with an error; ``status`` is its HTTP status."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status


FINISHED_TASK_STATES = ("done", "unavailable", "cancelled")


def finished(view: dict[str, Any]) -> bool:
    """Whether nothing of the evaluation (a view as the API returns it) runs any more."""
    progress = view["progress"]
    done = sum(int(progress["counts"].get(state, 0)) for state in FINISHED_TASK_STATES)
    return done == int(progress["total"])


class GatewayClient:
    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ):
        """``api_key``: this service's key, sent as ``Authorization: Bearer``."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"), timeout=timeout_s, transport=transport, headers=headers
        )

    def __repr__(self) -> str:
        return f"GatewayClient({str(self._http.base_url)!r})"

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._http.request(method, path, **kwargs)
        if response.status_code >= 400:
            try:
                detail = str(response.json().get("detail", response.text))
            except ValueError:
                detail = response.text[:500]
            raise GatewayError(response.status_code, detail)
        return response.json()

    def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/evaluations``; returns the evaluation view (its id under ``evaluation.id``)."""
        result: dict[str, Any] = self._call("POST", "/v1/evaluations", json=body)
        return result

    def evaluation(self, evaluation_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/v1/evaluations/{evaluation_id}")
        return result

    def results(self, evaluation_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/v1/evaluations/{evaluation_id}/results")
        return result

    def trajectory(self, evaluation_id: str, task_index: int) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/v1/evaluations/{evaluation_id}/tasks/{task_index}/trajectory")
        return result

    def wait(self, evaluation_id: str, timeout_s: float, poll_s: float = DEFAULT_POLL_S) -> dict[str, Any]:
        """Poll until the evaluation completes; return its last view.

        Raises:
            TimeoutError: it did not complete within ``timeout_s``; the message gives the progress.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            view = self.evaluation(evaluation_id)
            if finished(view):
                return view
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"evaluation {evaluation_id} did not complete in {timeout_s:.0f} s: {view['progress']}"
                )
            time.sleep(poll_s)
