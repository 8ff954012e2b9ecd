"""Grading sessions of real suite tasks into verdicts."""

from datetime import UTC, datetime
from pathlib import Path

import pytest

from grader.grading import grade
from services.suite import Suite, load_suite
from services.trajectory import EndReason, Message, SessionInfo, Trajectory
from services.verdict import VerdictStatus


@pytest.fixture(scope="module")
def suite(suite_path: Path) -> Suite:
    return load_suite(suite_path)


def trajectory(index: int, last: Message, end: EndReason = EndReason.NO_CODE, error: str | None = None) -> Trajectory:
    return Trajectory(
        evaluation_id="e",
        task_index=index,
        attempt=1,
        messages=[Message(role="system", content="s"), Message(role="user", content="q"), last],
        end_reason=end,
        error=error,
        session=SessionInfo(
            sandbox_backend="docker", sandbox_id="abc", sandbox_name="n", image="i", started_at=datetime.now(UTC)
        ),
    )


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


def test_a_check_kind_not_implemented_makes_the_task_ungradable(suite: Suite) -> None:
    task = suite.task(2)  # csv_no_duplicates
    verdict = grade(task, trajectory(2, Message(role="assistant", content="Finished")), ["./output/2.csv"])
    assert verdict.status is VerdictStatus.UNGRADABLE and "not implemented" in verdict.reason
