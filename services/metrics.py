"""PyBench's figures over a list of verdicts: pass rate overall and per paper category, average turns.

The pass rate divides by every task of the evaluation, as the benchmark divides by all 143: unavailable,
ungradable and infra-failed tasks count as not passed (their counts are reported beside it).
"""

from statistics import fmean

from services.task import PAPER_CATEGORIES
from services.verdict import CategoryMetrics, Metrics, Results, Verdict, VerdictStatus

_SCORED = (VerdictStatus.PASSED, VerdictStatus.FAILED)


def _rate(passed: int, tasks: int) -> float:
    return passed / tasks if tasks else 0.0


def compute_metrics(verdicts: list[Verdict]) -> Metrics:
    """Return the metrics of ``verdicts`` (one per task); an empty list gives zeros."""
    passed = sum(1 for v in verdicts if v.status is VerdictStatus.PASSED)
    per_category: dict[str, CategoryMetrics] = {}
    for category in PAPER_CATEGORIES:
        members = [v for v in verdicts if v.paper_category == category]
        if members:
            won = sum(1 for v in members if v.status is VerdictStatus.PASSED)
            per_category[category] = CategoryMetrics(tasks=len(members), passed=won, pass_rate=_rate(won, len(members)))
    scored_turns = [v.turns for v in verdicts if v.status in _SCORED]
    return Metrics(
        tasks=len(verdicts),
        passed=passed,
        pass_rate=_rate(passed, len(verdicts)),
        per_category=per_category,
        avg_turns=fmean(scored_turns) if scored_turns else 0.0,
        by_status={status: sum(1 for v in verdicts if v.status is status) for status in VerdictStatus},
    )


def build_results(evaluation_id: str, verdicts: list[Verdict], complete: bool) -> Results:
    """Return the results document of an evaluation: its verdicts (by task) and their metrics."""
    ordered = sorted(verdicts, key=lambda v: v.task_index)
    return Results(evaluation_id=evaluation_id, complete=complete, verdicts=ordered, metrics=compute_metrics(ordered))
