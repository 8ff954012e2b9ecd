"""Code extraction as PyBench does it."""

import json
from pathlib import Path

import pytest

from services.extraction import extract_code


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
    ],
)
def test_extraction_rules(reply: str, code: str | None) -> None:
    assert extract_code(reply) == code


def test_every_recorded_reply_with_a_python_fence_yields_code(suite_path: Path) -> None:
    replies = [
        m["content"]
        for line in (suite_path / "trajectory.jsonl").read_text(encoding="utf-8").splitlines()
        for m in json.loads(line)["messages"]
        if m["role"] == "assistant" and "```python" in m["content"]
    ]
    assert len(replies) > 300
    assert all(extract_code(reply) for reply in replies)
