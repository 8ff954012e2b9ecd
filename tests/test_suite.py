"""Loading PyBench's suite from its path: categories, availability, prompts."""

from collections import Counter
from pathlib import Path

import pytest

from services.errors import SuiteError, TaskNotFoundError
from services.pybench.suite import load_suite

MISSING = [13, 17, 23, 25, 34, 42, 54, 55, 56, 66, 142]


def test_the_five_paper_categories_count_62_23_48_6_4(suite_path: Path) -> None:
    suite = load_suite(suite_path)
    assert len(suite.tasks) == 143
    counts = Counter(task.paper_category for task in suite.tasks.values())
    assert counts == {"Chart": 62, "Text": 23, "Image&Audio": 48, "Math": 6, "Software": 4}


def test_tasks_with_a_missing_input_are_kept_and_marked_unavailable(suite_path: Path) -> None:
    suite = load_suite(suite_path)
    assert sorted(t.index for t in suite.tasks.values() if not t.available) == MISSING
    assert suite.task(13).missing_inputs and not suite.task(2).missing_inputs


def test_every_task_has_checks(suite_path: Path) -> None:
    assert all(task.checks for task in load_suite(suite_path).tasks.values())


def test_prompts_and_their_settings_come_from_the_suite(suite_path: Path) -> None:
    suite = load_suite(suite_path)
    assert {"gpt", "llama3"} <= set(suite.prompts())
    assert "<|execute_start|>" in suite.system_prompt("llama3")
    assert suite.prompt_config("llama3").sampling == {"temperature": 0.2, "max_tokens": 1000, "top_p": 0.85}
    with pytest.raises(SuiteError, match="gpt"):
        suite.system_prompt("nosuch")


def test_unknown_task_and_escaping_input_names_are_refused(suite_path: Path, tmp_path: Path) -> None:
    suite = load_suite(suite_path)
    with pytest.raises(TaskNotFoundError, match="143"):
        suite.task(100000)
    with pytest.raises(SuiteError, match="outside"):
        suite.input_file("../../etc/passwd")
    with pytest.raises(SuiteError, match="PBE_SUITE_PATH"):
        load_suite(tmp_path)
