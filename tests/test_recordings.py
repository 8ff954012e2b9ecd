"""The reader of PyBench's trajectory.jsonl and PyBench's message conventions, on the real recordings."""

import json
from pathlib import Path

import pytest

from services.errors import SuiteError, TaskNotFoundError
from services.pybench.recordings import RecordedTrajectory, read_recordings, recording_of
from services.pybench.rules import (
    INTERPRETER_PREFIX,
    data_message_text,
    interpreter_output,
    is_interpreter_message,
    task_query,
)
from services.trajectory import Message


@pytest.fixture(scope="module")
def recordings(suite_path: Path) -> list[RecordedTrajectory]:
    return read_recordings(suite_path / "trajectory.jsonl")


def test_every_recorded_task_is_read_with_its_index_query_and_messages(
    recordings: list[RecordedTrajectory], suite_path: Path
) -> None:
    assert len(recordings) == 135
    assert len({r.index for r in recordings}) == 135
    for recording in recordings:
        assert recording.index == int(recording.record["index"])
        assert recording.query == recording.record["user"].strip()
        assert recording.query == (task_query(recording.messages) or "").strip()
        assert [m["role"] for m in recording.messages] == [m["role"] for m in recording.record["messages"]]
        assert recording.messages[0]["role"] == "system"
        assert recording.replies and all(isinstance(reply, str) for reply in recording.replies)
    raw = (suite_path / "trajectory.jsonl").read_text(encoding="utf-8").splitlines()
    assert [r.record for r in recordings] == [json.loads(line) for line in raw]


def test_recording_of_finds_a_task_and_refuses_an_unrecorded_one(suite_path: Path) -> None:
    recording = recording_of(suite_path / "trajectory.jsonl", 44)
    assert recording.index == 44 and recording.record["index"] == "44"
    with pytest.raises(TaskNotFoundError, match="records no trajectory of task 24"):
        recording_of(suite_path / "trajectory.jsonl", 24)  # a task PyBench did not record


def test_the_first_line_of_a_task_wins_and_missing_fields_are_filled(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    lines = [
        {"index": "7", "messages": [{"role": "user", "content": "[INFO]data"}, {"role": "user", "content": " q1 "}]},
        {},  # not read: recording_of stops at task 7's first line
        {"index": 7, "user": "other", "messages": []},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n", encoding="utf-8")
    first = recording_of(path, 7)
    assert first.query == "q1" and first.messages[1] == {"role": "user", "content": " q1 "}
    path.write_text(
        json.dumps({"user": "  ", "messages": [{"role": "assistant"}, {"role": "user", "content": None}]}) + "\n",
        encoding="utf-8",
    )
    (only,) = read_recordings(path)
    assert only.index is None and only.query == ""
    assert only.messages == [{"role": "assistant", "content": ""}, {"role": "user", "content": ""}]


@pytest.mark.parametrize(
    ("line", "what"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "JSON list"),
        ('{"index": "1"}', "no 'messages' list"),
        ('{"messages": ["hello"]}', "message 0 has no 'role'"),
        ('{"index": "one", "messages": []}', "is not a task index"),
    ],
)
def test_a_malformed_line_is_named_with_what_to_do(tmp_path: Path, line: str, what: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"index": "1", "messages": []}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(SuiteError, match=f"line 2: not a recorded trajectory.*{what}.*fix or remove the line"):
        read_recordings(path)
    with pytest.raises(SuiteError, match="line 2"):
        recording_of(path, 2)
    assert recording_of(path, 1).index == 1  # lines after the task's are not read


def test_an_unreadable_file_says_what_to_give(tmp_path: Path) -> None:
    with pytest.raises(SuiteError, match="cannot read recorded trajectories.*give the path of a PyBench"):
        read_recordings(tmp_path / "none.jsonl")
    (tmp_path / "latin1.jsonl").write_bytes(b'{"messages": [], "user": "caf\xe9"}\n')
    with pytest.raises(SuiteError, match="cannot read recorded trajectories"):
        recording_of(tmp_path / "latin1.jsonl", 1)


def test_the_query_is_found_in_dicts_and_messages_alike() -> None:
    dicts: list[dict[str, str | None]] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": None},
        {"role": "user", "content": data_message_text(["./data/a.csv", "./data/b.csv"])},
        {"role": "user", "content": "the query "},
    ]
    assert dicts[2]["content"] == "[INFO]The data is uploaded to ./data/a.csv,./data/b.csv"
    assert task_query(dicts) == "the query "
    messages = [
        Message(role="system", content="s"),
        Message(role="user", content="[INFO]x"),
        Message(role="user", content="q"),
    ]
    assert task_query(messages) == "q"
    assert task_query(messages[:2]) is None and task_query([]) is None


def test_interpreter_messages_are_matched_without_the_prefix_newline(recordings: list[RecordedTrajectory]) -> None:
    recorded = [m for r in recordings for m in r.messages if is_interpreter_message(m)]
    assert recorded and all(m["content"].startswith(INTERPRETER_PREFIX) for m in recorded)
    assert is_interpreter_message(Message(role="user", content=INTERPRETER_PREFIX + "ok"))
    assert is_interpreter_message({"role": "user", "content": "[INFO]This is a Code Interpreter Message:ok"})
    assert is_interpreter_message(Message(role="tool", tool_call_id="c1", content=INTERPRETER_PREFIX + "ok"))
    assert not is_interpreter_message({"role": "assistant", "content": INTERPRETER_PREFIX})
    assert not is_interpreter_message({"role": "user", "content": None})
    assert interpreter_output(INTERPRETER_PREFIX + "\nout\n") == "\nout\n"
    assert interpreter_output("[INFO]This is a Code Interpreter Message:out") == "out"
    assert interpreter_output("plain") == "plain"
