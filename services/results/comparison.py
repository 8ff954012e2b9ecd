"""Verdicts as outcomes for the statistics (``services.results.estimates``): each task's pass or fail under a grading,
or
None where the grading could not decide (an infrastructure failure, an unavailable or ungradable task, a judge
that gave no answer), and the paired comparison of two evaluations of the same comparable runs.

Gradings: ``original`` (PyBench's own tests, the verdict's status), ``fixed`` (the tests that follow each task's
intent), ``judge`` (the LLM judge's judgment; ``unparseable`` counts as not passed, as in the judge's pass rate).
"""

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from services.results.estimates import PairedComparison, RateEstimate, compare, estimate
from services.verdict import JudgmentStatus, Verdict, VerdictStatus

Outcomes = dict[int, list[bool | None]]
"""Per task, its outcome in each epoch (one evaluation: one epoch)."""

GRADINGS = ("original", "fixed", "judge")

_DECIDED = {VerdictStatus.PASSED: True, VerdictStatus.FAILED: False}
_JUDGED = {JudgmentStatus.PASSED: True, JudgmentStatus.FAILED: False, JudgmentStatus.UNPARSEABLE: False}


def _original(verdict: Verdict) -> bool | None:
    return _DECIDED.get(verdict.status)


def _fixed(verdict: Verdict) -> bool | None:
    return _DECIDED.get(verdict.fixed.status) if verdict.fixed is not None else None


def _judge(verdict: Verdict) -> bool | None:
    return _JUDGED.get(verdict.judgment.status) if verdict.judgment is not None else None


OUTCOME_OF: dict[str, Callable[[Verdict], bool | None]] = {"original": _original, "fixed": _fixed, "judge": _judge}
"""How a verdict passes or fails under each grading (None: undecided)."""


def outcomes(runs: Iterable[Sequence[Verdict]], grading: str, category: str | None = None) -> Outcomes:
    """Per task, its outcome under ``grading`` in each run of ``runs`` (each run one epoch: an evaluation's
    verdicts), only of tasks in ``category`` when one is given.

    Raises:
        KeyError: ``grading`` is not one of ``GRADINGS``.
    """
    outcome_of = OUTCOME_OF[grading]
    table: Outcomes = {}
    for verdicts in runs:
        for verdict in verdicts:
            if category is None or verdict.paper_category == category:
                table.setdefault(verdict.task_index, []).append(outcome_of(verdict))
    return table


def _categories(runs: Iterable[Sequence[Verdict]]) -> list[str]:
    return sorted({verdict.paper_category for verdicts in runs for verdict in verdicts})


def estimates(runs: Sequence[Sequence[Verdict]]) -> dict[str, Any]:
    """For each grading (the judge's only when some verdict has a judgment): the estimate over the suite and per
    category, JSON-ready: ``{grading: {"all": {...}, "per_category": {name: {...}}}}``."""
    graded: dict[str, Any] = {}
    for grading in GRADINGS:
        if grading == "judge" and not _judged(runs):
            continue
        overall: RateEstimate = estimate(outcomes(runs, grading))
        graded[grading] = {
            "all": overall.as_dict(),
            "per_category": {c: estimate(outcomes(runs, grading, c)).as_dict() for c in _categories(runs)},
        }
    return graded


def paired(a: Sequence[Sequence[Verdict]], b: Sequence[Sequence[Verdict]]) -> dict[str, Any]:
    """The paired comparison of two sets of runs (B minus A) for each grading both sides have, over the tasks both
    decided, overall and per category: ``{grading: {"all": {...}, "per_category": {...}}}``."""
    compared: dict[str, Any] = {}
    categories = _categories([*a, *b])
    for grading in GRADINGS:
        if grading == "judge" and not (_judged(a) and _judged(b)):
            continue
        overall: PairedComparison = compare(outcomes(a, grading), outcomes(b, grading))
        compared[grading] = {
            "all": overall.as_dict(),
            "per_category": {
                c: compare(outcomes(a, grading, c), outcomes(b, grading, c)).as_dict() for c in categories
            },
        }
    return compared


def _judged(runs: Sequence[Sequence[Verdict]]) -> bool:
    return any(verdict.judgment is not None for verdicts in runs for verdict in verdicts)
