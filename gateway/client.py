"""A small client of the gateway's REST API (used by the demo, the end-to-end tests and the CLI).

Errors, translated at this boundary from httpx's::

    PybenchEvalError
    ├── GatewayError               the gateway answered with an error status (``status``, the problem's ``detail``)
    └── GatewayUnreachableError    no answer: connection refused, DNS, timeout, a stream that keeps dropping
"""

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from services.errors import PybenchEvalError

DEFAULT_POLL_S = 1.0
"""How often ``wait`` asks for progress."""

DEFAULT_STREAM_READ_TIMEOUT_S = 60.0
"""How long an event stream may stay silent (the gateway sends a heartbeat every 15 s) before it counts as dropped."""

DEFAULT_RECONNECT_S = 1.0
"""The first pause before reconnecting a dropped event stream; it doubles per failure, up to ten seconds."""

DEFAULT_MAX_RECONNECTS = 5
"""Failed connections in a row (none yielding an event) after which ``events`` gives up."""

DEFAULT_MAX_WAIT_S = 600.0
"""How long, in all, one call waits out ``429 Too Many Requests`` (and ``503`` with ``Retry-After``) before it
raises the refusal: the gateway counts requests per key and minute, so a minute always clears a rate limit."""

DEFAULT_RETRY_AFTER_S = 5.0
"""The pause after a refusal that names no ``Retry-After``."""

MAX_RETRY_AFTER_S = 60.0
"""The longest single pause, whatever ``Retry-After`` asks."""

WaitNotice = Callable[[float, str], None]
"""Told before each pause: how many seconds, and why (``HTTP 429: ...``)."""


def retry_after_s(response: httpx.Response) -> float | None:
    """The pause a refusal asks for: ``Retry-After`` in seconds (an HTTP date counts as the default pause), for
    429 always and for 503 when it names one; None when the answer is not one to wait out."""
    header = response.headers.get("Retry-After")
    if response.status_code != 429 and not (response.status_code == 503 and header):
        return None
    try:
        seconds = float(header) if header else DEFAULT_RETRY_AFTER_S
    except ValueError:
        seconds = DEFAULT_RETRY_AFTER_S
    return min(max(seconds, 0.5), MAX_RETRY_AFTER_S)


class GatewayError(PybenchEvalError):
    """The gateway answered with an error; ``status`` is its HTTP status, ``detail`` the problem's detail."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


class GatewayUnreachableError(PybenchEvalError):
    """The gateway could not be reached, or did not answer in time."""


FINISHED_TASK_STATES = ("done", "unavailable", "cancelled")


def finished(view: dict[str, Any]) -> bool:
    """Whether nothing of the evaluation (a view as the API returns it) runs any more."""
    progress = view["progress"]
    done = sum(int(progress["counts"].get(state, 0)) for state in FINISHED_TASK_STATES)
    return done == int(progress["total"])


def _parse_data(lines: list[str]) -> Any:
    text = "\n".join(lines)
    try:
        return json.loads(text)
    except ValueError:
        return text


def _given(**fields: Any) -> dict[str, Any] | None:
    """A request body of the ``fields`` given (not None); None when none is (the route's defaults apply)."""
    return {name: value for name, value in fields.items() if value is not None} or None


class GatewayClient:
    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        max_wait_s: float = DEFAULT_MAX_WAIT_S,
        on_wait: WaitNotice | None = None,
    ):
        """``api_key``: this service's key, sent as ``Authorization: Bearer``. Every call waits out 429 (and 503
        with ``Retry-After``) for up to ``max_wait_s`` in all, telling ``on_wait`` before each pause."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._max_wait_s = max_wait_s
        self._on_wait = on_wait
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"), timeout=timeout_s, transport=transport, headers=headers
        )

    def __repr__(self) -> str:
        return f"GatewayClient({str(self._http.base_url)!r})"

    def __enter__(self) -> "GatewayClient":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _unreachable(self, exc: httpx.TransportError) -> GatewayUnreachableError:
        reason = str(exc) or type(exc).__name__
        return GatewayUnreachableError(f"cannot reach the gateway at {self._http.base_url} ({reason})")

    @staticmethod
    def _raise_for_problem(response: httpx.Response) -> None:
        """Raises:
        GatewayError: the response has an error status; its message is the problem document's detail."""
        if response.status_code < 400:
            return
        try:
            body = response.json()
            detail = str(body.get("detail", response.text)) if isinstance(body, dict) else response.text[:500]
        except ValueError:
            detail = response.text[:500]
        raise GatewayError(response.status_code, detail)

    def _pause(self, response: httpx.Response, waited_s: float) -> float | None:
        """The pause to take before asking again after ``response``, or None to give up (not a refusal to wait
        out, or the call's waiting budget spent)."""
        pause = retry_after_s(response)
        if pause is None or waited_s + pause > self._max_wait_s:
            return None
        if self._on_wait is not None:
            try:
                detail = str(response.json().get("detail", ""))
            except (ValueError, AttributeError):
                detail = ""
            self._on_wait(pause, f"HTTP {response.status_code}: {detail}".rstrip(": "))
        return pause

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send a request and return its successful answer, waiting out rate limits (see ``__init__``).

        Raises:
            GatewayError: the gateway answered with an error status (a 429 once ``max_wait_s`` is spent).
            GatewayUnreachableError: no answer.
        """
        waited_s = 0.0
        while True:
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                raise self._unreachable(exc) from exc
            pause = self._pause(response, waited_s)
            if pause is None:
                break
            time.sleep(pause)
            waited_s += pause
        self._raise_for_problem(response)
        return response

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        """The JSON of a successful answer.

        Raises:
            GatewayError: the gateway answered with an error status.
            GatewayUnreachableError: no answer.
        """
        return self._request(method, path, **kwargs).json()

    def submit(self, body: dict[str, Any], *, idempotency_key: str | None = None) -> dict[str, Any]:
        """``POST /v1/evaluations``; returns the evaluation view (its id under ``evaluation.id``). With an
        ``idempotency_key``, a repeated submission returns the evaluation the first one made."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        result: dict[str, Any] = self._call("POST", "/v1/evaluations", json=body, headers=headers)
        return result

    def evaluation(self, evaluation_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/v1/evaluations/{evaluation_id}")
        return result

    def evaluations(
        self, *, limit: int = 20, cursor: str | None = None, model: str | None = None, status: str | None = None
    ) -> dict[str, Any]:
        """One page of ``GET /v1/evaluations`` (newest first): ``items`` and ``next_cursor``."""
        params: dict[str, Any] = {"limit": limit}
        params.update({k: v for k, v in (("cursor", cursor), ("model", model), ("status", status)) if v is not None})
        result: dict[str, Any] = self._call("GET", "/v1/evaluations", params=params)
        return result

    def cancel(self, evaluation_id: str) -> dict[str, Any]:
        """Cancel the evaluation's queued tasks (running ones stop at their next turn); returns its view."""
        result: dict[str, Any] = self._call("POST", f"/v1/evaluations/{evaluation_id}/cancel")
        return result

    def send_keys(self, evaluation_id: str, api_key: str | None, judge_api_key: str | None) -> dict[str, Any]:
        """Give the gateway the evaluation's keys again (after it lost them); returns its view (without keys)."""
        body = {name: key for name, key in (("api_key", api_key), ("judge_api_key", judge_api_key)) if key}
        result: dict[str, Any] = self._call("PUT", f"/v1/evaluations/{evaluation_id}/keys", json=body)
        return result

    def retry(
        self,
        evaluation_id: str,
        tasks: list[int] | None = None,
        api_key: str | None = None,
        judge_api_key: str | None = None,
    ) -> dict[str, Any]:
        """Run failed tasks again (all failed ones when ``tasks`` is None), with the evaluation's keys when given
        (a finished evaluation no longer holds them); returns the evaluation's view."""
        body = _given(tasks=tasks, api_key=api_key, judge_api_key=judge_api_key)
        result: dict[str, Any] = self._call("POST", f"/v1/evaluations/{evaluation_id}/retry", json=body)
        return result

    def results(self, evaluation_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/v1/evaluations/{evaluation_id}/results")
        return result

    def tasks(self, evaluation_id: str) -> list[dict[str, Any]]:
        """Every task of the evaluation: ``index``, ``state`` and its ``verdict`` once graded."""
        result: list[dict[str, Any]] = self._call("GET", f"/v1/evaluations/{evaluation_id}/tasks")
        return result

    def trajectory(self, evaluation_id: str, task_index: int, attempt: int | None = None) -> dict[str, Any]:
        """The trajectory of a task's session, its latest attempt unless ``attempt`` is given."""
        params = {"attempt": attempt} if attempt is not None else None
        path = f"/v1/evaluations/{evaluation_id}/tasks/{task_index}/trajectory"
        result: dict[str, Any] = self._call("GET", path, params=params)
        return result

    def files(self, evaluation_id: str, task_index: int, attempt: int | None = None) -> list[str]:
        """The files a task's session saved, as ``./output/...`` names."""
        params = {"attempt": attempt} if attempt is not None else None
        result: list[str] = self._call(
            "GET", f"/v1/evaluations/{evaluation_id}/tasks/{task_index}/files", params=params
        )
        return result

    def download(self, evaluation_id: str, task_index: int, name: str, attempt: int | None = None) -> bytes:
        """The content of one saved file (``name`` as ``files`` lists it)."""
        params = {"attempt": attempt} if attempt is not None else None
        name = name.removeprefix("./").removeprefix("output/")
        path = f"/v1/evaluations/{evaluation_id}/tasks/{task_index}/files/{name}"
        return self._request("GET", path, params=params).content

    def archive(self, evaluation_id: str, dest: Path) -> int:
        """Download the whole evaluation as one ``.tar.gz`` into the file ``dest`` (see ``gateway.archive``);
        returns its size in bytes. Waits out rate limits like every call.

        Raises:
            GatewayError: the gateway answered with an error status.
            GatewayUnreachableError: no answer, or the download broke off.
            OSError: ``dest`` cannot be written.
        """
        path = f"/v1/evaluations/{evaluation_id}/archive"
        waited_s = 0.0
        while True:
            pause: float | None = None
            try:
                with self._http.stream("GET", path) as response:
                    if response.status_code >= 400:
                        response.read()
                        pause = self._pause(response, waited_s)
                        if pause is None:
                            self._raise_for_problem(response)
                            raise GatewayError(response.status_code, "unexpected answer")  # not reached
                    else:
                        size = 0
                        with dest.open("wb") as handle:
                            for chunk in response.iter_bytes():
                                handle.write(chunk)
                                size += len(chunk)
                        return size
            except httpx.TransportError as exc:
                raise self._unreachable(exc) from exc
            time.sleep(pause)
            waited_s += pause

    def leaderboard(self) -> list[dict[str, Any]]:
        """Per model, its best and latest completed evaluation, best pass rate first."""
        result: list[dict[str, Any]] = self._call("GET", "/v1/leaderboard")
        return result

    def regrade(
        self, evaluation_id: str, judge: dict[str, Any] | None = None, judge_api_key: str | None = None
    ) -> dict[str, Any]:
        """Grade a finished evaluation again from its stored sessions (with ``judge``, a judge config, when
        given); returns the evaluation's view."""
        body = _given(judge=judge, judge_api_key=judge_api_key)
        result: dict[str, Any] = self._call("POST", f"/v1/evaluations/{evaluation_id}/regrade", json=body)
        return result

    def epochs(self, evaluation_id: str) -> dict[str, Any]:
        """The run that ``evaluation_id`` is an epoch of: its epochs and its statistics."""
        result: dict[str, Any] = self._call("GET", f"/v1/evaluations/{evaluation_id}/epochs")
        return result

    def compare(self, a: str, b: str) -> dict[str, Any]:
        """The paired comparison of evaluation ``b`` against ``a`` (``GET /v1/compare``; differences are B - A)."""
        result: dict[str, Any] = self._call("GET", "/v1/compare", params={"a": a, "b": b})
        return result

    def suite_tasks(self, suite: str) -> list[dict[str, Any]]:
        """A suite's tasks: ``index``, ``paper_category``, ``category1``, ``available``."""
        result: list[dict[str, Any]] = self._call("GET", f"/v1/suites/{suite}/tasks")
        return result

    def events(
        self,
        evaluation_id: str,
        *,
        reconnect_s: float = DEFAULT_RECONNECT_S,
        max_reconnects: int = DEFAULT_MAX_RECONNECTS,
        read_timeout_s: float = DEFAULT_STREAM_READ_TIMEOUT_S,
    ) -> Iterator[tuple[str, Any]]:
        """Follow the evaluation's server-sent events, yielding ``(event, data)`` (data parsed as JSON) until
        the ``end`` event, which is yielded last. A stream that drops or ends early is opened again; after a
        reconnection the gateway sends the progress and every verdict so far again.

        Raises:
            GatewayError: the gateway refused the stream (a 4xx answer other than 429: unknown evaluation, bad key).
            GatewayUnreachableError: ``max_reconnects`` connections in a row failed or yielded nothing.
        """
        path = f"/v1/evaluations/{evaluation_id}/events"
        timeout = httpx.Timeout(self._http.timeout.connect, read=read_timeout_s)
        failures, last = 0, "the stream ended before its end event"
        while True:
            received = False
            try:
                with self._http.stream("GET", path, timeout=timeout) as response:
                    if response.status_code >= 400:
                        response.read()
                        if response.status_code < 500 and response.status_code != 429:
                            self._raise_for_problem(response)
                        last = f"HTTP {response.status_code}"
                    else:
                        for name, data in self._parse_events(response.iter_lines()):
                            received = True
                            yield name, data
                            if name == "end":
                                return
            except httpx.TransportError as exc:
                last = str(self._unreachable(exc))
            failures = 0 if received else failures + 1
            if failures > max_reconnects:
                raise GatewayUnreachableError(
                    f"the event stream of {evaluation_id} failed {failures} times in a row; last: {last}"
                )
            time.sleep(min(reconnect_s * 2 ** max(failures - 1, 0), 10.0))

    @staticmethod
    def _parse_events(lines: Iterator[str]) -> Iterator[tuple[str, Any]]:
        """Server-sent events from the lines of a stream: ``event:`` and ``data:`` fields, a blank line ends
        an event, ``:`` lines are comments."""
        name = "message"
        data: list[str] = []
        for line in lines:
            if not line:
                if data:
                    yield name, _parse_data(data)
                name, data = "message", []
            elif line.startswith(":"):
                continue
            else:
                field, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if field == "event":
                    name = value
                elif field == "data":
                    data.append(value)

    def wait(self, evaluation_id: str, timeout_s: float, poll_s: float = DEFAULT_POLL_S) -> dict[str, Any]:
        """Poll until the evaluation completes; return its last view.

        Raises:
            TimeoutError: it did not complete within ``timeout_s``; the message gives the progress.
            GatewayError: the gateway answered with an error status.
            GatewayUnreachableError: no answer.
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
