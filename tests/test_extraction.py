"""Code extraction as PyBench does it."""

from pathlib import Path

import pytest

from services.pybench.extraction import extract_code, find_cell
from services.pybench.recordings import read_recordings


@pytest.mark.parametrize(
    ("reply", "code"),
    [
        ("Analyse: x\n```python\nprint(1)\n```\n", "print(1)"),
        ("```python\na = 1\n```\ntext\n```python\nb = 2\n```", "a = 1"),
        ("<|execute_start|>\n```python\nprint(2)\n```\n<|execute_end|>", "print(2)"),
        ("<|execute_start|>\nprint(3)\n<|execute_end|>", "print(3)"),
        ("Action:\n```python\nx = 1\nprint(x", "x = 1\nprint(x"),
        ("Finished: the answer is 42", None),
        ("```python\n   \n```", None),
        ("```bash\nls\n```", None),
        ("```python\ndraft()\n```\n<|execute_start|>\n```\nrun()\n```\n<|execute_end|>", "run()"),
    ],
)
def test_extraction_rules(reply: str, code: str | None) -> None:
    assert extract_code(reply) == code
    cell = find_cell(reply)
    assert (cell.code if cell is not None else None) == code
    if cell is not None:  # the span is the whole block, markers or fence included
        block = reply[cell.start : cell.end]
        assert cell.code in block and block.startswith(("```", "<|execute_start|>"))


def test_every_recorded_reply_with_a_python_fence_yields_code(suite_path: Path) -> None:
    replies = [
        reply
        for recording in read_recordings(suite_path / "trajectory.jsonl")
        for reply in recording.replies
        if "```python" in reply
    ]
    assert len(replies) > 300
    assert all(extract_code(reply) for reply in replies)
