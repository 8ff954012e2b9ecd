"""The harness's messages have exactly the shapes of PyBench's recorded trajectories."""

import json
import re
from pathlib import Path

from executor.messages import INTERPRETER_PREFIX, interpreter_message, opening_messages, output_text
from executor.output import CellOutput
from services.suite import load_suite
from services.trajectory import Execution


def records(suite_path: Path) -> list[dict[str, object]]:
    lines = (suite_path / "trajectory.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def test_opening_messages_match_every_recording(suite_path: Path) -> None:
    suite = load_suite(suite_path)
    prompt = suite.system_prompt("gpt")
    checked = 0
    for record in records(suite_path):
        messages: list[dict[str, str]] = record["messages"]  # type: ignore[assignment]
        first_assistant = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
        ours = [m.model_dump() for m in opening_messages(prompt, suite.task(int(str(record["index"]))))]
        assert ours == messages[:first_assistant], record["index"]
        checked += 1
    assert checked == 135


def test_interpreter_replies_and_errors_have_the_recorded_shape(suite_path: Path) -> None:
    replies = [
        m["content"]
        for record in records(suite_path)
        for m in record["messages"]  # type: ignore[attr-defined]
        if m["role"] == "user" and m["content"].startswith("[INFO]This is a Code Interpreter")
    ]
    assert replies and all(reply.startswith(INTERPRETER_PREFIX) for reply in replies)
    recorded_error = next(r for r in replies if "\nError: ZeroDivisionError" in r or "\nError: NameError" in r)
    match = re.search(r"\nError: (\w+)\n(.*)\n$", recorded_error, re.DOTALL)
    assert match is not None
    ours = interpreter_message(Execution(error_name=match.group(1), error_value=match.group(2)), CellOutput())
    assert ours.content == recorded_error


def test_a_shown_chart_adds_no_text_and_a_result_keeps_its_repr_as_in_the_recordings() -> None:
    output = CellOutput()
    output.add("stream", {"name": "stdout", "text": "saved\n"})
    output.add(
        "display_data", {"data": {"image/png": "iVBORw0KGgo=", "text/plain": "<Figure size 640x480 with 1 Axes>"}}
    )
    output.add("execute_result", {"data": {"image/png": "iVBORw0KGgo=", "text/plain": "<PIL.Image.Image size=2x2>"}})
    assert output_text(output) == "saved\n<PIL.Image.Image size=2x2>"
    assert len(output.images) == 2
