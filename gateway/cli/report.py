"""The results of an evaluation as tables: pass rates per paper category, then one row per task."""

from typing import Any

from services.task import PAPER_CATEGORIES
from services.verdict import CategoryMetrics, Metrics, Results, Verdict, VerdictStatus

from .printer import Printer, ratio, shorten

REASON_WIDTH = 60
"""Characters of a verdict's reason shown in the task table."""


def _ordered(categories: set[str]) -> list[str]:
    return [c for c in PAPER_CATEGORIES if c in categories] + sorted(categories - set(PAPER_CATEGORIES))


def _cells(metrics: CategoryMetrics | None) -> list[str]:
    if metrics is None:
        return ["-", "-"]
    return [ratio(metrics.passed, metrics.tasks), ratio(metrics.passed, metrics.gradable)]


def _total(per_category: dict[str, CategoryMetrics]) -> CategoryMetrics:
    tasks = sum(m.tasks for m in per_category.values())
    passed = sum(m.passed for m in per_category.values())
    gradable = sum(m.gradable for m in per_category.values())
    return CategoryMetrics(
        tasks=tasks,
        passed=passed,
        pass_rate=passed / tasks if tasks else 0.0,
        gradable=gradable,
        pass_rate_gradable=passed / gradable if gradable else 0.0,
    )


def interval_text(row: dict[str, Any]) -> str:
    """A rate with its 95% interval and what it is over: ``62.5% [41.0, 84.0] over 8 tasks (2 excluded)``."""
    if row.get("mean") is None:
        return "no task decided"
    text = f"{100 * row['mean']:.1f}%"
    if row.get("ci_low") is not None:
        text += f" [{100 * row['ci_low']:.1f}, {100 * row['ci_high']:.1f}]"
    text += f" over {row['tasks']} tasks"
    return text + (f" ({row['excluded']} excluded)" if row.get("excluded") else "")


def print_intervals(printer: Printer, statistics: dict[str, Any]) -> None:
    """Each grading's pass rate over the tasks it decided, with its 95% confidence interval (clustered by task)."""
    for grading, parts in statistics.items():
        printer.line(f"{grading}: {interval_text(parts['all'])} (95% interval, infrastructure failures excluded)")


def print_pass_rates(printer: Printer, metrics: Metrics) -> None:
    """Per paper category and over all: the original grading's pass rates (over every task, over the gradable
    ones), the fixed grading's and, with a judge, the LLM's."""
    headers = ["category", "tasks", "original", "original gradable", "fixed", "fixed gradable"]
    if metrics.llm is not None:
        headers += ["LLM", "LLM gradable"]
    gradings: list[dict[str, CategoryMetrics]] = [
        metrics.per_category,
        metrics.fixed.per_category if metrics.fixed else {},
    ]
    if metrics.llm is not None:
        gradings.append(metrics.llm.per_category)
    rows = []
    for category in _ordered(set(metrics.per_category)):
        row = [category, str(metrics.per_category[category].tasks)]
        for per_category in gradings:
            row += _cells(per_category.get(category))
        rows.append(row)
    total = [_total(per_category) if per_category else None for per_category in gradings]
    rows.append(["all", str(metrics.tasks), *(cell for t in total for cell in _cells(t))])
    printer.table(headers, rows, title="Pass rates (tests: original = PyBench's own, fixed = each task's intent)")
    statuses = ", ".join(f"{status.value} {n}" for status, n in metrics.by_status.items() if n)
    printer.line(
        f"by status: {statuses or 'none yet'}; average turns {metrics.avg_turns:.1f} "
        f"(paper's count {metrics.avg_turns_paper:.1f})"
    )
    if metrics.llm is not None:
        agreement = metrics.llm.agreement.get("all")
        judge = (
            f"judge: {metrics.llm.judged} judged, {metrics.llm.unparseable} unparseable, {metrics.llm.errors} errors"
        )
        if agreement is not None:
            judge += (
                f"; against the fixed tests: both passed {agreement.both_passed}, tests only {agreement.tests_only}, "
                f"judge only {agreement.judge_only}, both failed {agreement.both_failed}"
            )
            if agreement.disagreeing:
                judge += f" (disagreeing: {', '.join(map(str, agreement.disagreeing))})"
        printer.line(judge)
    printer.line()


def _reason(verdict: Verdict) -> str:
    reason = verdict.reason or (verdict.fixed.reason if verdict.fixed else "")
    return shorten(reason, REASON_WIDTH) if reason else ""


def print_tasks(printer: Printer, results: Results, states: dict[int, str], categories: dict[int, str]) -> None:
    """One row per task of the evaluation: its gradings, turns and reason, or its state while not graded."""
    verdicts = {v.task_index: v for v in results.verdicts}
    rows = []
    for index in sorted(set(states) | set(verdicts)):
        verdict = verdicts.get(index)
        if verdict is None:
            state = states.get(index, "?")
            rows.append([str(index), categories.get(index, "?"), state, "-", "-", "-", ""])
            continue
        task = str(index) if verdict.attempt <= 1 else f"{index} (attempt {verdict.attempt})"
        rows.append(
            [
                task,
                verdict.paper_category,
                verdict.status.value,
                verdict.fixed.status.value if verdict.fixed else "-",
                verdict.judgment.status if verdict.judgment else "-",
                str(verdict.turns) if verdict.status is not VerdictStatus.UNAVAILABLE else "-",
                _reason(verdict),
            ]
        )
    printer.table(["task", "category", "original", "fixed", "judge", "turns", "reason"], rows, title="Tasks")


def summary_line(results: Results) -> str:
    """How many tasks passed under each grading: ``original 2/4 50.0%, fixed 3/4 75.0%, LLM ...``."""
    metrics = results.metrics
    parts = [f"original {ratio(metrics.passed, metrics.tasks)}"]
    if metrics.fixed is not None:
        parts.append(f"fixed {ratio(metrics.fixed.passed, metrics.fixed.tasks)}")
    if metrics.llm is not None:
        parts.append(f"LLM {ratio(metrics.llm.passed, metrics.tasks)}")
    return ", ".join(parts)


def usage_line(metrics: Metrics) -> str:
    """``tokens: 1,234 prompt + 567 completion · cost $0.01 · 3 model calls (1,200 tokens) replayed, not paid
    again`` (the cost only when the submission gave prices; the replayed calls only when a retry replayed some)."""
    line = f"tokens: {metrics.prompt_tokens:,} prompt + {metrics.completion_tokens:,} completion"
    if metrics.cost_usd is not None:
        line += f" · cost ${metrics.cost_usd:.4f}"
    if metrics.model_calls_saved:
        saved = f"{metrics.model_calls_saved:,} model calls ({metrics.tokens_saved:,} tokens)"
        line += f" · {saved} replayed, not paid again"
    return line


def manifest_line(manifest: dict[str, Any]) -> str:
    """What the run ran with, on one line: version, suite hash, prompt, mode, sandbox image, judge."""
    parts = [
        f"pybench-eval {manifest.get('service_version', '?')}",
        f"suite {manifest.get('suite', '?')}@{str(manifest.get('suite_hash', ''))[:12]}",
        f"prompt {manifest.get('prompt', '?')}@{str(manifest.get('system_prompt_hash', ''))[:12]}",
        f"mode {manifest.get('mode', '?')}",
        f"image {manifest.get('sandbox_image') or 'not advertised yet'}",
        f"comparable runs {str(manifest.get('comparable_key', ''))[:12]}",
    ]
    if manifest.get("judge_model"):
        parts.append(f"judge {manifest['judge_model']} ({manifest.get('judge_mode')})")
    return "manifest: " + " · ".join(parts)
