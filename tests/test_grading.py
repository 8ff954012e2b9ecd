"""Grading sessions of real suite tasks into verdicts."""

from pathlib import Path
from typing import Any

import pytest

from grader.grading import grade
from grader.variants import VARIANTS, Grading, checks_for
from services.pybench.suite import Suite, load_suite
from services.trajectory import EndReason, Message, Trajectory
from services.verdict import CheckResult, VerdictStatus
from tests.factories import make_session_info, make_trajectory


@pytest.fixture(scope="module")
def suite(suite_path: Path) -> Suite:
    return load_suite(suite_path)


def trajectory(index: int, last: Message, end: EndReason = EndReason.NO_CODE, error: str | None = None) -> Trajectory:
    messages = [Message(role="system", content="s"), Message(role="user", content="q"), last]
    return make_trajectory("e", index, messages=messages, end_reason=end, error=error, session=make_session_info())


ANSWER_7 = (
    "Finished: Africa 48, Latin America 38, Asiatic Region 32, Western Europe 26, Eastern Europe 23, "
    "Middle East 15, Pacific Region 10, Northern America 2, Africa/Middle East 1"
)


def test_answer_checks_read_the_last_message(suite: Suite) -> None:
    verdict = grade(suite.task(7), trajectory(7, Message(role="assistant", content=ANSWER_7)), [])
    assert verdict.status is VerdictStatus.PASSED and verdict.turns == 1 and verdict.sandbox_id == "abc"
    assert verdict.paper_category == "Chart"
    wrong = grade(suite.task(7), trajectory(7, Message(role="assistant", content="Finished: 48 and 38")), [])
    assert wrong.status is VerdictStatus.FAILED and "missing from the answer" in wrong.reason


def test_a_session_that_hit_the_turn_limit_is_graded_on_its_last_message_whatever_its_role(suite: Suite) -> None:
    last = Message(role="user", content="[INFO]This is a Code Interpreter Message:\n" + ANSWER_7)
    verdict = grade(suite.task(7), trajectory(7, last, EndReason.MAX_TURNS), [])
    assert verdict.status is VerdictStatus.PASSED and verdict.turns == 0


def test_file_checks_read_the_produced_files(suite: Suite) -> None:
    done = Message(role="assistant", content="Finished: saved")
    assert grade(suite.task(44), trajectory(44, done), ["./output/44.png"]).status is VerdictStatus.PASSED
    assert grade(suite.task(44), trajectory(44, done), ["./output/other.png"]).status is VerdictStatus.FAILED


def test_a_broken_environment_is_an_infra_error_not_a_failure(suite: Suite) -> None:
    broken = trajectory(7, Message(role="user", content="q"), EndReason.SANDBOX_ERROR, "the kernel died")
    verdict = grade(suite.task(7), broken, [])
    assert verdict.status is VerdictStatus.INFRA_ERROR and "the kernel died" in verdict.reason


def test_file_opening_checks_without_a_grading_sandbox_leave_the_task_ungradable(suite: Suite) -> None:
    task = suite.task(2)  # csv_no_duplicates
    verdict = grade(task, trajectory(2, Message(role="assistant", content="Finished")), ["./output/2.csv"])
    assert verdict.status is VerdictStatus.UNGRADABLE and "needs a grading sandbox" in verdict.reason
    assert verdict.fixed is not None and verdict.fixed.status is VerdictStatus.UNGRADABLE


class RecordingRunner:
    """Answers file-opening checks with a fixed outcome and records what it was asked (no sandbox needed)."""

    def __init__(self, passed: bool) -> None:
        self.passed = passed
        self.calls: list[list[dict[str, Any]]] = []

    def __call__(self, checks: list[dict[str, Any]]) -> list[CheckResult]:
        self.calls.append(checks)
        return [CheckResult(kind=c["kind"], passed=self.passed, detail=f"recorded {c.get('path')}") for c in checks]


def test_both_gradings_share_one_sandbox_run_and_differ_where_the_benchmark_is_broken(suite: Suite) -> None:
    done = Message(role="assistant", content="Finished: saved")
    runner = RecordingRunner(passed=True)
    # Task 99: the benchmark wants the Laplacian variance lower after adding noise, the fixed grading higher.
    verdict = grade(suite.task(99), trajectory(99, done), ["./output/99.png"], runner)
    assert len(runner.calls) == 1 and [c["op"] for c in runner.calls[0]] == ["lt", "gt"]
    assert verdict.status is VerdictStatus.PASSED and verdict.fixed is not None
    assert verdict.fixed.status is VerdictStatus.PASSED
    # Task 82: the benchmark re-checks task 81's file; the fixed grading checks 82.png against 82.jpeg.
    runner = RecordingRunner(passed=True)
    grade(suite.task(82), trajectory(82, done), [], runner)
    assert [(c["path"], c["ref"]) for c in runner.calls[0]] == [
        ("./output/81.png", "./data/81.jpeg"),
        ("./output/82.png", "./data/82.jpeg"),
    ]


def test_forced_outcomes_of_broken_tests_apply_to_the_original_grading_only(suite: Suite) -> None:
    done = Message(role="assistant", content="Finished: saved")
    runner = RecordingRunner(passed=True)
    excel = grade(suite.task(11), trajectory(11, done), ["./output/11.xlsx"], runner)  # `assert df` always raises
    assert excel.status is VerdictStatus.FAILED and "always_fails" in excel.reason
    assert excel.fixed is not None and excel.fixed.status is VerdictStatus.PASSED
    assert [c["kind"] for c in runner.calls[0]] == ["excel_readable"]  # run once, for the fixed grading
    chart = grade(suite.task(20), trajectory(20, done), ["./output/20.png"])  # NameError in the test
    assert chart.status is VerdictStatus.FAILED and chart.fixed and chart.fixed.status is VerdictStatus.PASSED
    nothing = grade(suite.task(63), trajectory(63, done), [])  # the test discards os.path.exists
    assert nothing.status is VerdictStatus.PASSED and nothing.fixed and nothing.fixed.status is VerdictStatus.FAILED


def test_paths_the_query_names_are_checked_by_the_fixed_grading(suite: Suite) -> None:
    done = Message(role="assistant", content="Finished: saved")
    right = grade(suite.task(68), trajectory(68, done), ["./output/68.png"])
    assert right.status is VerdictStatus.FAILED and right.fixed and right.fixed.status is VerdictStatus.PASSED
    cloud = grade(suite.task(59), trajectory(59, done), ["./output/59.txt"])
    assert cloud.status is VerdictStatus.FAILED and cloud.fixed and cloud.fixed.status is VerdictStatus.PASSED


def test_the_fixed_grading_reads_the_final_assistant_answer_and_marks_offline_tasks_ungradable(suite: Suite) -> None:
    last = Message(role="user", content="[INFO]This is a Code Interpreter Message:\n" + ANSWER_7)
    verdict = grade(suite.task(7), trajectory(7, last, EndReason.MAX_TURNS), [])
    assert verdict.status is VerdictStatus.PASSED  # the benchmark reads the interpreter's output
    assert verdict.fixed is not None and verdict.fixed.status is VerdictStatus.FAILED  # no assistant answer
    offline = grade(suite.task(128), trajectory(128, Message(role="assistant", content="done")), ["./output/128.xlsx"])
    assert offline.status is VerdictStatus.PASSED
    assert offline.fixed is not None and offline.fixed.status is VerdictStatus.UNGRADABLE
    assert "internet" in offline.fixed.reason


def test_every_departure_names_a_real_task_and_its_fixed_checks_are_well_formed(suite: Suite) -> None:
    for index, variant in VARIANTS.items():
        task = suite.task(index)
        assert variant.why
        for check in checks_for(index, task.checks, Grading.FIXED):
            assert isinstance(check.get("kind"), str)
