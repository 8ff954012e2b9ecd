"""``watch``: follow an evaluation through its server-sent events until it ends, then print its pass rates.

On a terminal (with rich) one progress bar per paper category shows done/total and passed so far, with the
overall counts by state under it; elsewhere each event is printed as a plain line.
"""

import json
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.client import GatewayClient
from services.task import PAPER_CATEGORIES
from services.verdict import Results, Verdict, VerdictStatus

from .printer import Printer
from .report import print_pass_rates, summary_line

STATE_ORDER = ("queued", "running", "grading", "done", "unavailable", "cancelled")
"""Task states in the order they are shown."""


@dataclass
class WatchState:
    """What is known of the evaluation being watched."""

    evaluation_id: str
    model: str
    categories: dict[int, str]
    """Task index -> paper category, for every task of the evaluation."""
    status: str = "queued"
    counts: dict[str, int] = field(default_factory=dict)
    verdicts: dict[int, Verdict] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return len(self.categories)

    def rows(self) -> list[tuple[str, int, int, int]]:
        """Per paper category, in the paper's order: (category, done, total, passed by the original tests)."""
        present = set(self.categories.values())
        ordered = [c for c in PAPER_CATEGORIES if c in present] + sorted(present - set(PAPER_CATEGORIES))
        rows = []
        for category in ordered:
            members = [i for i, c in self.categories.items() if c == category]
            verdicts = [self.verdicts[i] for i in members if i in self.verdicts]
            passed = sum(1 for v in verdicts if v.status is VerdictStatus.PASSED)
            rows.append((category, len(verdicts), len(members), passed))
        return rows

    def row(self, category: str) -> tuple[str, int, int, int]:
        return next(r for r in self.rows() if r[0] == category)

    def overall(self) -> str:
        """``running: queued 1, running 2, done 3 (3/6 finished)``."""
        counts = ", ".join(f"{s} {self.counts[s]}" for s in STATE_ORDER if self.counts.get(s))
        finished = sum(self.counts.get(s, 0) for s in ("done", "unavailable", "cancelled"))
        return f"{self.status}: {counts or 'no tasks'} ({finished}/{self.total} finished)"


class WatchView(Protocol):
    def start(self, state: WatchState) -> None: ...

    def progress(self, state: WatchState) -> None: ...

    def verdict(self, state: WatchState, verdict: Verdict) -> None: ...

    def close(self) -> None: ...


class PlainWatchView:
    """One line per event, for pipes, logs and tests."""

    def __init__(self, printer: Printer) -> None:
        self.printer = printer

    def start(self, state: WatchState) -> None:
        per = ", ".join(f"{c} {total}" for c, _, total, _ in state.rows())
        self.printer.line(f"watching evaluation {state.evaluation_id} of {state.model}: {state.total} tasks ({per})")

    def progress(self, state: WatchState) -> None:
        self.printer.line(f"[{time.strftime('%H:%M:%S')}] {state.overall()}")

    def verdict(self, state: WatchState, verdict: Verdict) -> None:
        category, done, total, passed = state.row(state.categories.get(verdict.task_index, verdict.paper_category))
        attempt = f" (attempt {verdict.attempt})" if verdict.attempt > 1 else ""
        turns = f", {verdict.turns} turns" if verdict.turns else ""
        self.printer.line(
            f"[{time.strftime('%H:%M:%S')}] task {verdict.task_index}{attempt} {category}: {verdict.status.value}"
            f"{turns}; {category} {done}/{total} done, {passed} passed"
        )

    def close(self) -> None:
        return None


class _Overall:
    """The line under the bars: the overall counts by state (a rich renderable)."""

    def __init__(self, state: WatchState) -> None:
        self.state = state

    def __rich__(self) -> Any:
        from rich.text import Text

        return Text(self.state.overall())


class RichWatchView:
    """A live view: one progress bar per paper category (done/total, passed so far), the counts by state."""

    def __init__(self, printer: Printer) -> None:
        self.printer = printer
        self._bars: dict[str, Any] = {}
        self._progress: Any = None
        self._live: Any = None

    def start(self, state: WatchState) -> None:
        from rich.console import Group
        from rich.live import Live
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        console = self.printer.console
        console.print(f"evaluation [bold]{state.evaluation_id}[/bold] of {state.model}: {state.total} tasks")
        self._progress = Progress(
            TextColumn("{task.description:<12}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("[green]passed {task.fields[passed]}"),
            console=console,
        )
        for category, done, total, passed in state.rows():
            self._bars[category] = self._progress.add_task(category, total=total, completed=done, passed=passed)
        self._live = Live(Group(self._progress, _Overall(state)), console=console, refresh_per_second=4)
        self._live.start()

    def _refresh(self, state: WatchState) -> None:
        for category, done, total, passed in state.rows():
            if category not in self._bars:
                self._bars[category] = self._progress.add_task(category, total=total, passed=passed)
            self._progress.update(self._bars[category], total=total, completed=done, passed=passed)
        self._live.refresh()

    def progress(self, state: WatchState) -> None:
        self._refresh(state)

    def verdict(self, state: WatchState, verdict: Verdict) -> None:
        self._refresh(state)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()


def task_categories(client: GatewayClient, suite: str, tasks: list[int]) -> dict[int, str]:
    """Task index -> paper category for ``tasks`` of the suite.

    Raises:
        GatewayError: the gateway answered with an error status.
        GatewayUnreachableError: no answer.
    """
    known = {int(t["index"]): str(t["paper_category"]) for t in client.suite_tasks(suite)}
    return {index: known.get(index, "?") for index in tasks}


def watch(client: GatewayClient, evaluation_id: str, printer: Printer, *, json_lines: bool = False) -> Results:
    """Follow the evaluation until its ``end`` event, showing its progress; print and return its results.

    ``json_lines``: print each event as one JSON line (``{"event": ..., "data": ...}``) instead, and no summary.
    After a reconnection the gateway sends the progress and the verdicts so far again: they are shown once.

    Raises:
        GatewayError: the gateway answered with an error status (an unknown evaluation: 404).
        GatewayUnreachableError: the gateway cannot be reached, or its event stream keeps dropping.
    """
    view_json = client.evaluation(evaluation_id)
    evaluation = view_json["evaluation"]
    state = WatchState(
        evaluation_id=evaluation_id,
        model=str(evaluation["model"]["model"]),
        categories=task_categories(client, str(evaluation["suite"]), [int(i) for i in evaluation["tasks"]]),
    )
    view: WatchView = RichWatchView(printer) if printer.styled else PlainWatchView(printer)
    if not json_lines:
        view.start(state)
    try:
        for name, data in client.events(evaluation_id):
            if json_lines:
                print(json.dumps({"event": name, "data": data}, ensure_ascii=False), file=printer.out, flush=True)
            if name == "progress" and isinstance(data, dict):
                counts = {str(k): int(v) for k, v in data.get("counts", {}).items()}
                status = str(data.get("status", state.status))
                if (status, counts) == (state.status, state.counts):
                    continue
                state.status, state.counts = status, counts
                if not json_lines:
                    view.progress(state)
            elif name == "verdict" and isinstance(data, dict):
                verdict = Verdict.model_validate(data)
                if state.verdicts.get(verdict.task_index) == verdict:
                    continue
                state.categories.setdefault(verdict.task_index, verdict.paper_category)
                state.verdicts[verdict.task_index] = verdict
                if not json_lines:
                    view.verdict(state, verdict)
            elif name == "end":
                if isinstance(data, dict):
                    state.status = str(data.get("status", state.status))
                break
    finally:
        view.close()
    results = Results.model_validate(client.results(evaluation_id))
    if not json_lines:
        printer.line()
        printer.line(f"evaluation {evaluation_id} {state.status}; passed: {summary_line(results)}")
        print_pass_rates(printer, results.metrics)
    return results
