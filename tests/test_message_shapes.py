"""The harness's messages have exactly the shapes of PyBench's recorded trajectories."""

import re
from pathlib import Path

from executor.messages import interpreter_message, opening_messages, output_text
from executor.output import CellOutput
from services.pybench.recordings import RecordedTrajectory, read_recordings
from services.pybench.rules import INTERPRETER_PREFIX
from services.pybench.suite import load_suite
from services.trajectory import Execution


def recordings(suite_path: Path) -> list[RecordedTrajectory]:
    return read_recordings(suite_path / "trajectory.jsonl")


def test_opening_messages_match_every_recording(suite_path: Path) -> None:
    suite = load_suite(suite_path)
    prompt = suite.system_prompt("gpt")
    checked = 0
    for recording in recordings(suite_path):
        messages: list[dict[str, str]] = recording.record["messages"]  # as recorded, not as the reader reduces them
        first_assistant = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
        assert recording.index is not None
        ours = [m.model_dump() for m in opening_messages(prompt, suite.task(recording.index))]
        assert ours == messages[:first_assistant], recording.index
        checked += 1
    assert checked == 135


def test_interpreter_replies_and_errors_have_the_recorded_shape(suite_path: Path) -> None:
    replies = [
        m["content"]
        for recording in recordings(suite_path)
        for m in recording.messages
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
