"""The check vocabulary: each kind passes and fails on fixtures; unknown kinds and bad parameters never raise."""

import pytest

from grader.checks import CheckContext, run_check, runs_in_process

CONTEXT = CheckContext(answer="Finished: Africa has 48 and Asia 32", output_files=frozenset({"./output/1.png"}))


@pytest.mark.parametrize(
    ("check", "passed"),
    [
        ({"kind": "answer_contains_all", "strings": ["48", "32"]}, True),
        ({"kind": "answer_contains_all", "strings": ["48", "38"]}, False),
        ({"kind": "answer_contains_any", "strings": ["99", "Asia"]}, True),
        ({"kind": "answer_contains_any", "strings": ["99", "Europe"]}, False),
        ({"kind": "file_exists", "paths": ["./output/1.png"]}, True),
        ({"kind": "file_exists", "paths": ["output/1.png"]}, True),
        ({"kind": "file_exists", "paths": ["./output/1.png", "./output/2.png"]}, False),
    ],
)
def test_each_kind_passes_and_fails(check: dict[str, object], passed: bool) -> None:
    result = run_check(check, CONTEXT)
    assert result.kind == check["kind"] and result.passed is passed


def test_a_failed_check_says_what_is_missing() -> None:
    result = run_check({"kind": "file_exists", "paths": ["./output/2.png"]}, CONTEXT)
    assert "./output/2.png" in result.detail


def test_a_kind_that_opens_files_is_undecided_in_process() -> None:
    assert not runs_in_process({"kind": "image_size", "path": "./output/1.png"})
    result = run_check({"kind": "image_size", "path": "./output/1.png"}, CONTEXT)
    assert result.passed is None and "does not run in the grader's process" in result.detail


def test_file_exists_any_needs_one_of_its_paths() -> None:
    check = {"kind": "file_exists_any", "paths": ["./output/59.txt", "./output/1.png"]}
    assert runs_in_process(check) and run_check(check, CONTEXT).passed is True
    assert run_check({**check, "paths": ["./output/59.txt"]}, CONTEXT).passed is False


@pytest.mark.parametrize(
    ("produced", "passed"),
    [
        ({"./output/140"}, True),  # a plain file: os.path.exists passes it
        ({"./output/140/snake.py"}, True),  # a folder with files
        ({"./output/140/"}, True),  # an empty folder
        ({"./output/1400", "./output/140.py", "./output/140_old/a.py"}, False),  # names that only start alike
        (set(), False),
    ],
)
def test_path_exists_is_existence_as_os_path_exists_sees_it(produced: set[str], passed: bool) -> None:
    check = {"kind": "path_exists", "path": "./output/140"}
    result = run_check(check, CheckContext(answer="", output_files=frozenset(produced)))
    assert runs_in_process(check) and result.passed is passed
    assert ("./output/140" in result.detail) and (("nothing" in result.detail) is not passed)


@pytest.mark.parametrize(
    "check",
    [
        {"kind": "path_exists", "path": "./"},
        {"kind": "answer_contains_all"},
        {"kind": "answer_contains_any", "strings": []},
        {"kind": "file_exists", "paths": "./output/1.png"},
        {"kind": "answer_contains_all", "strings": [48]},
    ],
)
def test_malformed_parameters_fail_with_the_reason(check: dict[str, object]) -> None:
    result = run_check(check, CONTEXT)
    assert result.passed is False and "malformed" in result.detail
