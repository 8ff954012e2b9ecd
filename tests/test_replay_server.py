"""The replay model: a real server on loopback answering with recorded assistant messages."""

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from replay.recordings import load_recordings
from replay.server import END_OF_RECORDING, SEED_GIVES_UP, create_app
from services.endpoint.client import EndpointClient
from services.errors import ConfigurationError, ModelResponseError
from services.pybench.extraction import extract_code
from services.pybench.recordings import recording_of
from services.trajectory import Message
from tests.servers import serve


@pytest.fixture(scope="module")
def record(suite_path: Path) -> dict[str, object]:
    return recording_of(suite_path / "trajectory.jsonl", 44).record


@pytest.fixture(scope="module")
def url(suite_path: Path) -> Iterator[str]:
    with serve(create_app(suite_path / "trajectory.jsonl")) as base:
        yield base


def opening(record: dict[str, object]) -> list[dict[str, str]]:
    messages: list[dict[str, str]] = record["messages"]  # type: ignore[assignment]
    first_assistant = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return messages[:first_assistant]


def test_replies_follow_the_recording_turn_by_turn(url: str, record: dict[str, object]) -> None:
    messages: list[dict[str, str]] = record["messages"]  # type: ignore[assignment]
    recorded = [m["content"] for m in messages if m["role"] == "assistant"]
    conversation = opening(record)
    for expected in recorded:
        reply = httpx.post(f"{url}/v1/chat/completions", json={"model": "x", "messages": conversation}).json()
        assert reply["object"] == "chat.completion" and reply["choices"][0]["finish_reason"] == "stop"
        assert reply["choices"][0]["message"]["content"] == expected
        assert reply["usage"]["total_tokens"] == reply["usage"]["prompt_tokens"] + reply["usage"]["completion_tokens"]
        conversation = [
            *conversation,
            {"role": "assistant", "content": expected},
            {"role": "user", "content": "[INFO]This is a Code Interpreter Message:\nok"},
        ]
    past_end = httpx.post(f"{url}/v1/chat/completions", json={"messages": conversation}).json()
    assert past_end["choices"][0]["message"]["content"] == END_OF_RECORDING
    assert extract_code(END_OF_RECORDING) is None


def test_an_unrecorded_task_and_a_malformed_request_get_openai_style_errors(url: str) -> None:
    unknown = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hello?"}]})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "task_not_recorded"
    malformed = httpx.post(f"{url}/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"})
    assert malformed.status_code == 400 and "error" in malformed.json()
    empty = httpx.post(f"{url}/v1/chat/completions", json={"messages": []})
    assert empty.status_code == 400


def test_models_and_health(url: str) -> None:
    assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "pybench-replay"
    assert httpx.get(f"{url}/health").json() == {"status": "ok", "recordings": 135}


def test_the_model_client_speaks_to_it(url: str, record: dict[str, object]) -> None:
    client = EndpointClient(url + "/v1", "pybench-replay")
    completion = client.complete([Message.model_validate(m) for m in opening(record)], {"temperature": 0.2})
    assert extract_code(completion.text) is not None and completion.completion_tokens
    with pytest.raises(ModelResponseError, match="404"):
        client.complete([Message(role="user", content="not a task")], {})
    client.close()


def test_a_missing_or_broken_recording_file_says_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="--trajectories"):
        load_recordings(tmp_path / "none.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"messages": 3}\n')
    with pytest.raises(ConfigurationError, match="line 1"):
        load_recordings(tmp_path / "bad.jsonl")
    (tmp_path / "no-query.jsonl").write_text('{"messages": [{"role": "user", "content": "[INFO]data"}]}\n')
    with pytest.raises(ConfigurationError, match="no task query"):
        load_recordings(tmp_path / "no-query.jsonl")


def test_a_query_is_matched_without_its_surrounding_spaces(url: str, suite_path: Path) -> None:
    recording = recording_of(suite_path / "trajectory.jsonl", 140)
    assert recording.record["user"] != recording.query  # PyBench's query ends with a space
    reply = httpx.post(f"{url}/v1/chat/completions", json={"messages": recording.messages[:3]}).json()
    assert reply["choices"][0]["message"]["content"] == recording.replies[0]


def test_with_the_seed_split_odd_seeds_give_up_and_even_ones_replay(
    suite_path: Path, record: dict[str, object]
) -> None:
    messages: list[dict[str, str]] = record["messages"]  # type: ignore[assignment]
    first = next(m["content"] for m in messages if m["role"] == "assistant")
    with serve(create_app(suite_path / "trajectory.jsonl", seed_split=True)) as base:

        def reply(**extra: object) -> str:
            body = {"messages": opening(record), **extra}
            return str(httpx.post(f"{base}/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"])

        assert reply(seed=3) == SEED_GIVES_UP and extract_code(SEED_GIVES_UP) is None
        assert reply(seed=4) == first and reply() == first
    with serve(create_app(suite_path / "trajectory.jsonl")) as base:  # without it, the seed changes nothing
        body = {"messages": opening(record), "seed": 3}
        assert httpx.post(f"{base}/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"] == first
