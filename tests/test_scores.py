"""PyBench's metrics over verdicts."""

import pytest

from services.results.scores import build_results, compute_metrics
from services.verdict import GradingOutcome, VerdictStatus
from tests.factories import make_verdict


def test_pass_rate_divides_by_every_task_and_turns_average_the_scored_ones() -> None:
    metrics = compute_metrics(
        [
            make_verdict("e", 1, VerdictStatus.PASSED, category="Chart", turns=2),
            make_verdict("e", 2, VerdictStatus.FAILED, category="Chart", turns=10),
            make_verdict("e", 3, VerdictStatus.PASSED, category="Math", turns=3),
            make_verdict("e", 4, VerdictStatus.UNAVAILABLE, category="Text"),
            make_verdict("e", 5, VerdictStatus.INFRA_ERROR, category="Text", turns=1),
        ]
    )
    assert (metrics.tasks, metrics.passed) == (5, 2)
    assert metrics.pass_rate == pytest.approx(0.4)
    assert metrics.avg_turns == pytest.approx(5.0)
    assert metrics.per_category["Chart"].model_dump() == {
        "tasks": 2,
        "passed": 1,
        "pass_rate": 0.5,
        "gradable": 2,
        "pass_rate_gradable": 0.5,
    }
    assert (metrics.gradable, metrics.pass_rate_gradable) == (3, pytest.approx(2 / 3))
    assert metrics.avg_turns_paper == pytest.approx((2 + 10 + 3) / 3)
    assert metrics.per_category["Text"].pass_rate == 0.0
    assert list(metrics.per_category) == ["Chart", "Text", "Math"]
    assert metrics.by_status[VerdictStatus.UNAVAILABLE] == 1 and metrics.by_status[VerdictStatus.UNGRADABLE] == 0


def test_the_fixed_grading_is_reported_beside_the_original() -> None:
    broken = make_verdict("e", 11, VerdictStatus.FAILED, category="Chart", turns=3)
    broken.fixed = GradingOutcome(status=VerdictStatus.PASSED)
    offline = make_verdict("e", 128, VerdictStatus.PASSED, category="Text", turns=2)
    offline.fixed = GradingOutcome(status=VerdictStatus.UNGRADABLE, reason="needs the internet")
    metrics = compute_metrics([broken, offline, make_verdict("e", 7, VerdictStatus.PASSED, category="Chart", turns=1)])
    assert (metrics.passed, metrics.gradable) == (2, 3)
    assert metrics.fixed is not None
    assert (metrics.fixed.passed, metrics.fixed.gradable, metrics.fixed.tasks) == (2, 2, 3)
    assert metrics.fixed.pass_rate == pytest.approx(2 / 3) and metrics.fixed.pass_rate_gradable == 1.0
    assert metrics.fixed.per_category["Text"].gradable == 0
    assert metrics.fixed.by_status[VerdictStatus.UNGRADABLE] == 1
    # A failed task counts 10 in the paper's average turns, its own turns in the plain mean.
    assert metrics.avg_turns == pytest.approx(2.0) and metrics.avg_turns_paper == pytest.approx((10 + 2 + 1) / 3)


def test_no_verdicts_give_zeros() -> None:
    metrics = compute_metrics([])
    assert (metrics.tasks, metrics.pass_rate, metrics.avg_turns, metrics.per_category) == (0, 0.0, 0.0, {})


def test_results_list_verdicts_by_task() -> None:
    results = build_results(
        "e",
        [
            make_verdict("e", 9, VerdictStatus.PASSED, category="Math"),
            make_verdict("e", 3, VerdictStatus.FAILED, category="Math"),
        ],
        True,
    )
    assert [v.task_index for v in results.verdicts] == [3, 9] and results.complete
