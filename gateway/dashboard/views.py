"""What the dashboard's pages show, built from the live state, the results and the artifact store: one function per
page, returning plain data the templates lay out. None of them checks access (``access.visible_evaluation`` does,
before them)."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from markupsafe import Markup

from gateway import readmodel
from gateway.dashboard.charts import Interval, Series, grouped_bars
from gateway.dashboard.conversation import Block, conversation
from gateway.dashboard.files import kind, reference_names, suite_path
from gateway.dashboard.previews import Preview, preview
from gateway.dashboard.summaries import CACHE, TaskSummary
from services.errors import ArtifactNotFoundError, StoreError
from services.evaluation import Evaluation, EvaluationStatus, Progress
from services.pybench.suite import Suite
from services.results.comparison import paired
from services.state import EvaluationNotFoundError, StateStore
from services.store import ArtifactStore
from services.task import PAPER_CATEGORIES
from services.trajectory import Trajectory
from services.verdict import Metrics, Results, Verdict, VerdictStatus


@dataclass
class RunRow:
    """One evaluation in the runs list."""

    evaluation: Evaluation
    status: EvaluationStatus
    progress: Progress
    done: int
    pass_rate: float | None
    """The original grading's pass rate so far, over every task; None before any verdict."""


def run_rows(
    state: StateStore,
    owner: str | None,
    *,
    model: str = "",
    status: str = "",
    since: datetime | None = None,
    limit: int = 200,
) -> list[RunRow]:
    """The evaluations ``owner`` (None: all) may see, newest first, filtered by model name (substring), status and
    creation date."""
    rows = []
    for evaluation_id, created in state.evaluation_ids(owner, limit=limit):
        if since is not None and created < since.timestamp():
            break
        try:
            evaluation = state.get(evaluation_id)
        except EvaluationNotFoundError:  # its record is gone from Redis (expired, or flushed): nothing to show
            continue
        if model and model.lower() not in evaluation.model.model.lower():
            continue
        shown = readmodel.view(state, evaluation)
        if status and shown.status.value != status:
            continue
        verdicts = state.verdicts(evaluation_id)
        passed = sum(1 for v in verdicts if v.status is VerdictStatus.PASSED)
        rate = passed / len(evaluation.tasks) if verdicts and evaluation.tasks else None
        rows.append(RunRow(evaluation, shown.status, shown.progress, shown.progress.finished, rate))
    return rows


@dataclass
class TaskRow:
    """One task of an evaluation page."""

    index: int
    category: str
    state: str
    verdict: Verdict | None
    summary: TaskSummary | None
    attempt: int

    @property
    def status(self) -> str:
        return self.verdict.status.value if self.verdict else ""

    @property
    def fixed_status(self) -> str:
        return self.verdict.fixed.status.value if self.verdict and self.verdict.fixed else ""

    @property
    def judge_status(self) -> str:
        return self.verdict.judgment.status.value if self.verdict and self.verdict.judgment else ""

    @property
    def end_reason(self) -> str:
        return self.summary.end_reason if self.summary else ""


@dataclass
class EvaluationPage:
    evaluation: Evaluation
    status: EvaluationStatus
    progress: Progress
    done: int
    results: Results
    chart: Markup
    rows: list[TaskRow]
    """The tasks the filters keep."""
    all_rows: int
    categories: list[str]
    end_reasons: list[str]
    totals: dict[str, float]
    can_retry: bool
    filters: dict[str, str] = field(default_factory=dict)


def _interval_of(statistics: Mapping[str, Any], grading: str, category: str | None) -> Interval | None:
    """The 95% interval of ``grading``'s pass rate (``category`` None: over the suite) in a results document's
    ``statistics`` (``services.results.comparison.estimates``), or None when it has none (no such grading or category,
    or
    too few tasks decided for an interval)."""
    parts = statistics.get(grading)
    if not parts:
        return None
    row = parts["all"] if category is None else parts["per_category"].get(category)
    if not row or row.get("ci_low") is None or row.get("ci_high") is None:
        return None
    return Interval(low=row["ci_low"], high=row["ci_high"], mean=row["mean"], tasks=row["tasks"])


def _intervals(statistics: Mapping[str, Any], grading: str, categories: list[str]) -> list[Interval | None]:
    """One interval per group of a rate chart: over the suite, then per category."""
    return [_interval_of(statistics, grading, None), *(_interval_of(statistics, grading, c) for c in categories)]


def rate_chart(metrics: Metrics, statistics: Mapping[str, Any], title: str) -> Markup:
    """Pass rates (original, fixed, LLM judge) overall and per PyBench category, as one grouped bar chart, each bar
    with its 95% interval from ``statistics`` (a results document's) where there is one."""
    categories = [c for c in PAPER_CATEGORIES if c in metrics.per_category]
    groups = ["all", *categories]
    series = [
        Series(
            "original",
            [metrics.pass_rate, *(metrics.per_category[c].pass_rate for c in categories)],
            _intervals(statistics, "original", categories),
        )
    ]
    if metrics.fixed is not None:
        fixed = metrics.fixed
        values = [fixed.per_category[c].pass_rate if c in fixed.per_category else None for c in categories]
        series.append(Series("fixed", [fixed.pass_rate, *values], _intervals(statistics, "fixed", categories)))
    if metrics.llm is not None:
        llm = metrics.llm
        values = [llm.per_category[c].pass_rate if c in llm.per_category else None for c in categories]
        series.append(Series("LLM judge", [llm.pass_rate, *values], _intervals(statistics, "judge", categories)))
    return grouped_bars(groups, series, title=title)


def _tokens_per_task(verdicts: list[Verdict]) -> float:
    """The mean tokens (prompt + completion) of the graded tasks whose endpoint reported any, as the evaluation's
    token totals count them; 0 when none did."""
    reported = [(v.prompt_tokens or 0) + (v.completion_tokens or 0) for v in verdicts if v.prompt_tokens is not None]
    return sum(reported) / len(reported) if reported else 0.0


def evaluation_page(
    state: StateStore, store: ArtifactStore, suite: Suite, evaluation: Evaluation, filters: dict[str, str]
) -> EvaluationPage:
    """Everything the evaluation page shows; ``filters``: ``category``, ``verdict``, ``end_reason`` (empty: all)."""
    shown = readmodel.view(state, evaluation)
    results = readmodel.results(state, evaluation)
    verdicts = results.verdicts
    by_task = {v.task_index: v for v in verdicts}
    states = state.task_states(evaluation.id)
    rows = []
    for index, attempt in readmodel.latest_attempts(state, evaluation):
        category = suite.tasks[index].paper_category if index in suite.tasks else ""
        verdict = by_task.get(index)
        summary = CACHE.get(store, evaluation.id, index, verdict.attempt if verdict else attempt)
        task_state = states.get(index)
        rows.append(TaskRow(index, category, task_state.value if task_state else "", verdict, summary, attempt))
    summaries = [r.summary for r in rows if r.summary is not None]
    totals = {
        "tokens": float(sum(s.tokens for s in summaries)),
        "tokens_per_task": _tokens_per_task(verdicts),
        "wall_s": sum(s.wall_s for s in summaries) / len(summaries) if summaries else 0.0,
        "turns": sum(s.turns for s in summaries) / len(summaries) if summaries else 0.0,
        "cells": float(sum(s.cells for s in summaries)),
        "failed_cells": float(sum(s.failed_cells for s in summaries)),
    }
    kept = [
        row
        for row in rows
        if (not filters.get("category") or row.category == filters["category"])
        and (not filters.get("verdict") or row.status == filters["verdict"])
        and (not filters.get("end_reason") or row.end_reason == filters["end_reason"])
    ]
    return EvaluationPage(
        evaluation=evaluation,
        status=shown.status,
        progress=shown.progress,
        done=shown.progress.finished,
        results=results,
        chart=rate_chart(results.metrics, results.statistics, f"Pass rates of {evaluation.model.model}"),
        rows=kept,
        all_rows=len(rows),
        categories=sorted({row.category for row in rows if row.category}),
        end_reasons=sorted({row.end_reason for row in rows if row.end_reason}),
        totals=totals,
        can_retry=any(v.status in readmodel.RETRYABLE for v in verdicts) and not state.cancelled(evaluation.id),
        filters=filters,
    )


@dataclass
class ShownFile:
    """A file on the task page: where it is served from, how it is shown, and its preview."""

    name: str
    url: str
    kind: str
    preview: Preview | None = None
    role: str = "output"
    """``output`` (the session made it), ``input`` or ``reference`` (the suite's)."""


@dataclass
class TaskPage:
    evaluation: Evaluation
    task_index: int
    category: str
    attempt: int
    attempts: list[int]
    trajectory: Trajectory | None
    blocks: list[Block]
    verdict: Verdict | None
    files: list[ShownFile]
    suite_files: list[ShownFile]
    query: str = ""
    """The task's query as the suite words it (shown while there is no trajectory yet)."""


def _shown(name: str, path: Path | None, url: str, role: str) -> ShownFile:
    shown = kind(name)
    return ShownFile(name=name, url=url, kind=shown, preview=preview(path) if path is not None else None, role=role)


def task_page(
    state: StateStore,
    store: ArtifactStore,
    suite: Suite,
    evaluation: Evaluation,
    task_index: int,
    attempt: int | None,
    base_url: str,
) -> TaskPage:
    """Everything the task page shows; ``attempt`` None: the task's latest. ``base_url``: the task page's URL, the
    files' links start with it.

    Raises:
        TaskNotFoundError: the evaluation has no such task.
        ArtifactExpiredError: retention removed the attempt's files.
    """
    latest = readmodel.latest_attempt(state, evaluation, task_index)
    chosen = attempt if attempt is not None and 1 <= attempt <= latest else latest
    try:
        trajectory: Trajectory | None = store.get_trajectory(evaluation.id, task_index, chosen)
    except (ArtifactNotFoundError, StoreError):
        trajectory = None
    verdict = readmodel.attempt_verdict(state, store, evaluation.id, task_index, chosen)
    files = [
        _shown(saved.name, saved.path, f"{base_url}/files/{quote(saved.name)}?attempt={chosen}", "output")
        for saved in readmodel.output_files(store, evaluation.id, task_index, chosen)
    ]  # quoted: a produced name may hold '#', '?' or '%'
    task = suite.tasks.get(task_index)
    suite_files = []
    if task is not None:
        for role, names in (("input", [i.path for i in task.inputs]), ("reference", reference_names(task))):
            for name in names:
                path = suite_path(suite, task, name)
                url = f"{base_url}/suite/{quote(name.removeprefix('./'))}"
                suite_files.append(_shown(name, path, url, role))
    return TaskPage(
        evaluation=evaluation,
        task_index=task_index,
        category=task.paper_category if task is not None else "",
        attempt=chosen,
        attempts=list(range(1, latest + 1)),
        trajectory=trajectory,
        blocks=conversation(trajectory) if trajectory is not None else [],
        verdict=verdict,
        files=files,
        suite_files=suite_files,
        query=task.query if task is not None else "",
    )


@dataclass
class CompareRow:
    index: int
    category: str
    statuses: list[str]
    """Each evaluation's original status for the task, in the order given ('' when it has none)."""

    @property
    def differs(self) -> bool:
        passed = {s == VerdictStatus.PASSED.value for s in self.statuses}
        return len(passed) > 1


@dataclass
class ComparePage:
    evaluations: list[Evaluation]
    metrics: list[Metrics]
    chart: Markup
    rows: list[CompareRow]
    comparable: bool
    """All the evaluations share one comparability key (same suite content, tasks, prompt, mode, turn limit)."""
    wins: list[list[int]]
    """``wins[i][j]``: tasks evaluation i passes and evaluation j does not."""
    paired_test: dict[str, Any] | None = None
    """For two comparable evaluations: the paired test of the second against the first, per grading
    (``services.results.comparison.paired``, as ``GET /v1/compare`` gives it); None otherwise."""


def compare_page(state: StateStore, suite: Suite, evaluations: list[Evaluation]) -> ComparePage:
    """Two or more evaluations side by side, task by task, over the union of their tasks."""
    results = [readmodel.results(state, e) for e in evaluations]
    verdicts = [{v.task_index: v for v in r.verdicts} for r in results]
    metrics = [r.metrics for r in results]
    tasks = sorted({index for e in evaluations for index in e.tasks})
    rows = [
        CompareRow(
            index=index,
            category=suite.tasks[index].paper_category if index in suite.tasks else "",
            statuses=[found[index].status.value if index in found else "" for found in verdicts],
        )
        for index in tasks
    ]
    passed = [{i for i, v in found.items() if v.status is VerdictStatus.PASSED} for found in verdicts]
    wins = [[len(mine - theirs) for theirs in passed] for mine in passed]
    keys = {e.manifest.comparable_key if e.manifest else f"unrecorded:{e.id}" for e in evaluations}
    categories = [c for c in PAPER_CATEGORIES if any(c in m.per_category for m in metrics)]
    series = [
        Series(
            f"{e.model.model} ({e.id[:8]})",
            [m.pass_rate, *(m.per_category[c].pass_rate if c in m.per_category else None for c in categories)],
            _intervals(r.statistics, "original", categories),
        )
        for e, m, r in zip(evaluations, metrics, results, strict=True)
    ]
    chart = grouped_bars(["all", *categories], series, title="Pass rates side by side")
    paired_test = None
    if len(evaluations) == 2 and len(keys) == 1:
        paired_test = paired([list(verdicts[0].values())], [list(verdicts[1].values())])
    return ComparePage(evaluations, metrics, chart, rows, len(keys) == 1, wins, paired_test)
