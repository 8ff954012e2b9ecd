"""The LLM judge against a real, scripted OpenAI-compatible server on loopback (no mocked transport)."""

import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from grader.judge import (
    ABSOLUTE_USER_TEMPLATE,
    MAX_RAW_ANSWER_CHARS,
    PAIRWISE_USER_TEMPLATE,
    Judge,
    JudgeMode,
    JudgmentStatus,
    Preference,
    ResponseFormat,
    extract_json_object,
    prompt_hash,
    render_trajectory,
    shorten,
)
from services.errors import SuiteError, TaskNotFoundError
from services.pybench.recordings import RecordedTrajectory, recording_of
from services.trajectory import Message
from tests.judge_server import JudgeServer, Step
from tests.servers import free_port, serve

CANARY = "sk-canary-7f3a9c1e-do-not-leak"
"""An API key that must reach the server as a bearer token and nowhere else."""

MakeJudge = Callable[..., Judge]


def leaks(text: str) -> bool:
    """Whether ``text`` holds the canary key or any eight characters of it (a cut key leaks too)."""
    return any(CANARY[i : i + 8] in text for i in range(len(CANARY) - 7))


@pytest.fixture(scope="module")
def judge_server() -> Iterator[tuple[JudgeServer, str]]:
    server = JudgeServer()
    with serve(server.app) as url:
        yield server, url


@pytest.fixture()
def server(judge_server: tuple[JudgeServer, str]) -> JudgeServer:
    judge_server[0].reset()
    return judge_server[0]


@pytest.fixture()
def make_judge(judge_server: tuple[JudgeServer, str]) -> Iterator[MakeJudge]:
    """Make judges on the scripted server, with fast backoff; closed after the test."""
    judges: list[Judge] = []

    def make(**options: Any) -> Judge:
        settings: dict[str, Any] = {"timeout_s": 10.0, "retries": 2, "backoff_s": 0.001, "max_backoff_s": 5.0}
        base_url = options.pop("base_url", judge_server[1] + "/v1")
        judge = Judge(base_url, "judge-model", **(settings | options))
        judges.append(judge)
        return judge

    yield make
    for judge in judges:
        judge.close()


@pytest.fixture(scope="module")
def task_44(suite_path: Path) -> RecordedTrajectory:
    return recording_of(suite_path / "trajectory.jsonl", 44)


def verdict(passed: bool, reason: str = "the plot was saved as asked") -> str:
    return json.dumps({"reason": reason, "passed": passed})


def test_a_passing_verdict(server: JudgeServer, make_judge: MakeJudge, task_44: RecordedTrajectory) -> None:
    server.script(Step(content=verdict(True)))
    judgment = make_judge().judge_absolute(task_44.query, task_44.messages)

    assert judgment.status == JudgmentStatus.PASSED and judgment.passed
    assert judgment.mode == JudgeMode.ABSOLUTE
    assert judgment.reason == "the plot was saved as asked"
    assert judgment.judge_model == "judge-model"
    assert judgment.prompt_hash == prompt_hash("absolute") != prompt_hash("pairwise")
    assert judgment.raw_answer == verdict(True)
    assert (judgment.prompt_tokens, judgment.completion_tokens) == (321, 45)
    assert judgment.latency_s > 0 and judgment.attempts == 1
    assert judgment.response_format == ResponseFormat.JSON_SCHEMA
    assert judgment.preference is None and judgment.at_least_as_good is None

    (request,) = server.requests
    assert "authorization" not in request.headers
    assert request.body["model"] == "judge-model" and request.body["temperature"] == 0.0
    schema = request.body["response_format"]["json_schema"]
    assert schema["strict"] is True and schema["schema"]["required"] == ["reason", "passed"]
    system, user = request.body["messages"]
    assert system["role"] == "system" and "JSON" in system["content"]
    assert task_44.query in user["content"] and "## Agent's trajectory" in user["content"]
    assert task_44.messages[-1]["content"] in user["content"]
    assert user["content"].count(task_44.query) == 1, "the query is shown once, not again in the trajectory"


def test_a_failing_verdict_accepts_message_objects(
    server: JudgeServer, make_judge: MakeJudge, task_44: RecordedTrajectory
) -> None:
    server.script(Step(content=verdict(False, "no file was saved")))
    messages = [Message.model_validate(m) for m in task_44.messages]
    judgment = make_judge().judge_absolute(task_44.query, messages)

    assert judgment.status == JudgmentStatus.FAILED and not judgment.passed
    assert judgment.reason == "no file was saved"


def test_json_in_a_fence_amid_chatter(server: JudgeServer, make_judge: MakeJudge, task_44: RecordedTrajectory) -> None:
    answer = (
        "<think>the image exists; {not json}</think>Let me weigh this. The agent plotted Close against Date.\n"
        '```json\n{"reason": "title and path match", "passed": "Pass"}\n```\nHope this helps!'
    )
    server.script(Step(content=answer))
    judgment = make_judge().judge_absolute(task_44.query, task_44.messages)

    assert judgment.status == JudgmentStatus.PASSED
    assert judgment.reason == "title and path match"
    assert judgment.raw_answer == answer


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ("I think the agent did fine, passed: yes", "no JSON object"),
        ('{"reason": "cut off", "passed": tr', "no JSON object"),
        ('{"reason": "ok", "passed": "maybe"}', "passed"),
        ('{"verdict": "pass"}', "passed"),
        ("", "empty"),
    ],
)
def test_malformed_answers_are_unparseable(
    server: JudgeServer, make_judge: MakeJudge, task_44: RecordedTrajectory, answer: str, why: str
) -> None:
    server.script(Step(content=answer))
    judgment = make_judge().judge_absolute(task_44.query, task_44.messages)

    assert judgment.status == JudgmentStatus.UNPARSEABLE and not judgment.passed
    assert why in judgment.reason
    assert judgment.raw_answer == answer
    assert judgment.attempts == 1, "an unparseable answer is returned, not retried"


def test_a_long_raw_answer_is_cut(server: JudgeServer, make_judge: MakeJudge, task_44: RecordedTrajectory) -> None:
    server.script(Step(content="blah " * 5000 + verdict(True)))
    judgment = make_judge().judge_absolute(task_44.query, task_44.messages)

    assert judgment.status == JudgmentStatus.PASSED
    assert len(judgment.raw_answer) <= MAX_RAW_ANSWER_CHARS and "characters cut" in judgment.raw_answer


def test_falls_back_to_json_object_and_remembers(
    server: JudgeServer, make_judge: MakeJudge, task_44: RecordedTrajectory
) -> None:
    server.rejected_formats = {"json_schema"}
    server.script(Step(content=verdict(True)), Step(content=verdict(False)))
    judge = make_judge()

    first = judge.judge_absolute(task_44.query, task_44.messages)
    assert first.status == JudgmentStatus.PASSED
    assert first.response_format == ResponseFormat.JSON_OBJECT and first.attempts == 2
    assert [r.response_format for r in server.requests] == ["json_schema", "json_object"]
    assert judge.response_format == ResponseFormat.JSON_OBJECT

    second = judge.judge_absolute(task_44.query, task_44.messages)
    assert second.status == JudgmentStatus.FAILED and second.attempts == 1
    assert server.requests[-1].response_format == "json_object", "the judge remembers what the server supports"


def test_a_server_error_naming_the_format_falls_back_at_once(
    server: JudgeServer, make_judge: MakeJudge, task_44: RecordedTrajectory
) -> None:
    """llama-cpp-python's server answers ``json_schema`` with HTTP 500 and its validation error: retrying it would
    only get the same answer, so the judge moves on to ``json_object`` straight away."""
    refused = {
        "error": {
            "message": "1 validation error: ('body', 'response_format', 'type'): Input should be "
            "'text' or 'json_object'",
            "type": "internal_server_error",
        }
    }
    server.script(Step(status=500, body=refused), Step(content=verdict(True)))
    judge = make_judge()
    judgment = judge.judge_absolute(task_44.query, task_44.messages)

    assert judgment.status == JudgmentStatus.PASSED and judgment.attempts == 2
    assert [r.response_format for r in server.requests] == ["json_schema", "json_object"]
    assert judge.response_format == ResponseFormat.JSON_OBJECT


def test_a_server_error_without_a_format_is_retried_and_not_a_format_rejection(
    server: JudgeServer, make_judge: MakeJudge, task_44: RecordedTrajectory
) -> None:
    server.script(Step(status=500, body={"error": {"message": "out of memory"}}), Step(content=verdict(True)))
    judgment = make_judge().judge_absolute(task_44.query, task_44.messages)

    assert judgment.status == JudgmentStatus.PASSED and judgment.attempts == 2
    assert [r.response_format for r in server.requests] == ["json_schema", "json_schema"]


def test_falls_back_to_the_prompt_alone(
    server: JudgeServer, make_judge: MakeJudge, task_44: RecordedTrajectory
) -> None:
    server.rejected_formats = {"json_schema", "json_object"}
    server.script(Step(content="Sure.\n" + verdict(True)))
    judge = make_judge()
    judgment = judge.judge_absolute(task_44.query, task_44.messages)

    assert judgment.status == JudgmentStatus.PASSED and judgment.response_format == ResponseFormat.PROMPT
    assert [r.response_format for r in server.requests] == ["json_schema", "json_object", None]
    assert "JSON" in server.requests[-1].prompt, "the prompt itself asks for JSON"
    assert judge.response_format == ResponseFormat.PROMPT


def test_a_400_at_every_format_is_an_error_and_not_remembered(
    server: JudgeServer, make_judge: MakeJudge, task_44: RecordedTrajectory
) -> None:
    too_long = {"error": {"message": "prompt is longer than the context window", "type": "invalid_request_error"}}
    server.script(*[Step(status=400, body=too_long)] * 3, Step(content=verdict(True)))
    judge = make_judge()
    judgment = judge.judge_absolute(task_44.query, task_44.messages)

    assert judgment.status == JudgmentStatus.ERROR and not judgment.passed
    assert "HTTP 400" in judgment.reason and "context window" in judgment.reason
    assert judgment.attempts == 3 and judgment.response_format is None
    assert judge.response_format == ResponseFormat.JSON_SCHEMA, "no format was accepted, so none is remembered"
    assert judge.judge_absolute(task_44.query, task_44.messages).status == JudgmentStatus.PASSED
    assert server.requests[-1].response_format == "json_schema"


def test_429_with_retry_after_is_honoured(
    server: JudgeServer, make_judge: MakeJudge, task_44: RecordedTrajectory
) -> None:
    server.script(Step(status=429, headers={"Retry-After": "1"}), Step(content=verdict(True)))
    started = time.monotonic()
    judgment = make_judge().judge_absolute(task_44.query, task_44.messages)

    assert judgment.status == JudgmentStatus.PASSED and judgment.attempts == 2
    assert time.monotonic() - started >= 0.95, "the judge waited as Retry-After asked (its own backoff is 1 ms)"
    assert judgment.latency_s >= 0.95


def test_persistent_500_is_an_error_after_bounded_retries(
    server: JudgeServer, make_judge: MakeJudge, task_44: RecordedTrajectory
) -> None:
    server.script(*[Step(status=500)] * 4, Step(content=verdict(True)))
    started = time.monotonic()
    judgment = make_judge(retries=3).judge_absolute(task_44.query, task_44.messages)

    assert judgment.status == JudgmentStatus.ERROR and not judgment.passed
    assert "HTTP 500 4 times" in judgment.reason
    assert judgment.attempts == 4 and len(server.requests) == 4 and server.remaining == 1
    assert time.monotonic() - started < 2.0


def test_other_http_errors_are_not_retried(
    server: JudgeServer, make_judge: MakeJudge, task_44: RecordedTrajectory
) -> None:
    server.script(Step(status=404, body={"error": {"message": "model 'judge-model' not found"}}))
    judgment = make_judge().judge_absolute(task_44.query, task_44.messages)

    assert judgment.status == JudgmentStatus.ERROR and "HTTP 404" in judgment.reason and "not found" in judgment.reason
    assert judgment.attempts == 1


def test_a_200_that_is_not_a_chat_completion_is_an_error(
    server: JudgeServer, make_judge: MakeJudge, task_44: RecordedTrajectory
) -> None:
    server.script(Step(body={"result": "ok"}))
    judgment = make_judge().judge_absolute(task_44.query, task_44.messages)

    assert judgment.status == JudgmentStatus.ERROR and "not a chat completion" in judgment.reason


def test_a_timeout_is_retried_then_an_error(
    server: JudgeServer, make_judge: MakeJudge, task_44: RecordedTrajectory
) -> None:
    server.script(Step(content=verdict(True), delay_s=1.0), Step(content=verdict(True), delay_s=1.0))
    judgment = make_judge(timeout_s=0.2, retries=1).judge_absolute(task_44.query, task_44.messages)

    assert judgment.status == JudgmentStatus.ERROR
    assert "did not answer after 2 attempts (ReadTimeout)" in judgment.reason


def test_a_closed_port_is_an_error(make_judge: MakeJudge, task_44: RecordedTrajectory) -> None:
    judge = make_judge(base_url=f"http://127.0.0.1:{free_port()}/v1", retries=2)
    judgment = judge.judge_absolute(task_44.query, task_44.messages)

    assert judgment.status == JudgmentStatus.ERROR
    assert "did not answer after 3 attempts (ConnectError)" in judgment.reason


def test_the_api_key_goes_to_the_server_and_nowhere_else(
    server: JudgeServer, make_judge: MakeJudge, task_44: RecordedTrajectory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    echo = {"error": {"message": f"upstream rejected key {CANARY}"}}
    server.rejected_formats = {"json_schema"}
    server.script(
        Step(status=503, body=echo),
        Step(content=f'{{"reason": "the key {CANARY} was seen", "passed": false}} {CANARY}'),
        *[Step(status=500, body=echo)] * 3,
        # The key straddles the point where an error body is cut for the reason (300 characters).
        Step(status=401, body={"error": {"message": "Incorrect API key provided: ".ljust(265, ".") + CANARY}}),
    )
    judge = make_judge(api_key=SecretStr(CANARY))
    judgments = [judge.judge_absolute(task_44.query, task_44.messages) for _ in range(3)]

    assert [j.status for j in judgments] == [JudgmentStatus.FAILED, JudgmentStatus.ERROR, JudgmentStatus.ERROR]
    assert all(r.headers["authorization"] == f"Bearer {CANARY}" for r in server.requests)
    assert "[REDACTED]" in judgments[0].reason and "[REDACTED]" in judgments[0].raw_answer
    assert "[REDACTED]" in judgments[1].reason and "[REDACTED]" in judgments[2].reason
    for judgment in judgments:
        for text in (judgment.model_dump_json(), repr(judgment), str(judgment)):
            assert not leaks(text)
    assert not leaks(repr(judge))
    assert caplog.records, "the retries and errors were logged"
    assert not leaks(caplog.text)
    assert not any(leaks(record.getMessage()) for record in caplog.records)


def test_pairwise_against_a_recorded_reference(
    server: JudgeServer, make_judge: MakeJudge, suite_path: Path, task_44: RecordedTrajectory
) -> None:
    reference = recording_of(suite_path / "trajectory.jsonl", 15)
    assert reference.index == 15 and reference.query.startswith("按照avg_us_viewers")
    candidate = [
        *reference.messages[:3],
        {"role": "assistant", "content": "```python\nimport pandas as pd\ndf = pd.read_csv('./data/tv.csv')\n```"},
        {"role": "user", "content": "[INFO]This is a Code Interpreter Message:\nsaved ./output/15.csv"},
        {"role": "assistant", "content": "Finished: sorted and saved to ./output/15.csv"},
    ]
    answer = {"reason": "Agent 2 saved the file", "agent1_passed": "Failed", "agent2_passed": True, "better": "Agent 2"}
    server.script(Step(content=json.dumps(answer)))
    judgment = make_judge().judge_pairwise(reference.query, candidate, reference.messages)

    assert judgment.mode == JudgeMode.PAIRWISE and judgment.prompt_hash == prompt_hash(JudgeMode.PAIRWISE)
    assert judgment.status == JudgmentStatus.PASSED and judgment.reference_passed is False
    assert judgment.preference == Preference.CANDIDATE and judgment.at_least_as_good is True
    (request,) = server.requests
    assert request.body["response_format"]["json_schema"]["name"] == "pairwise_judgment"
    user = request.body["messages"][1]["content"]
    reference_part, candidate_part = user.split("## Agent 2's trajectory")
    assert "## Agent 1's trajectory" in reference_part and reference.messages[-1]["content"] in reference_part
    assert "Finished: sorted and saved to ./output/15.csv" in candidate_part
    assert user.count(reference.query) == 1


@pytest.mark.parametrize(
    ("better", "candidate_passed", "status", "preference", "at_least_as_good"),
    [
        ("agent1", False, JudgmentStatus.FAILED, Preference.REFERENCE, False),
        ("tie", True, JudgmentStatus.PASSED, Preference.TIE, True),
    ],
)
def test_pairwise_preferences(
    server: JudgeServer,
    make_judge: MakeJudge,
    task_44: RecordedTrajectory,
    better: str,
    candidate_passed: bool,
    status: JudgmentStatus,
    preference: Preference,
    at_least_as_good: bool,
) -> None:
    answer = {"reason": "r", "agent1_passed": True, "agent2_passed": candidate_passed, "better": better}
    server.script(Step(content=f"```\n{json.dumps(answer)}\n```"))
    judgment = make_judge().judge_pairwise(task_44.query, task_44.messages[:4], task_44.messages)

    assert (judgment.status, judgment.preference, judgment.at_least_as_good) == (status, preference, at_least_as_good)
    assert judgment.reference_passed is True


def test_pairwise_with_a_bad_preference_is_unparseable(
    server: JudgeServer, make_judge: MakeJudge, task_44: RecordedTrajectory
) -> None:
    answer = {"reason": "r", "agent1_passed": True, "agent2_passed": True, "better": "both"}
    server.script(Step(content=json.dumps(answer)))
    judgment = make_judge().judge_pairwise(task_44.query, task_44.messages, [])

    assert judgment.status == JudgmentStatus.UNPARSEABLE and "better" in judgment.reason
    assert judgment.preference is None
    assert "(no messages: the agent produced no trajectory)" in server.requests[0].prompt


def test_reference_errors(tmp_path: Path, suite_path: Path) -> None:
    with pytest.raises(TaskNotFoundError, match="task 24"):
        recording_of(suite_path / "trajectory.jsonl", 24)
    with pytest.raises(SuiteError, match="cannot read"):
        recording_of(tmp_path / "missing.jsonl", 1)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"index": 3, "messages": []}\nnot json\n', encoding="utf-8")
    with pytest.raises(SuiteError, match="line 2"):
        recording_of(broken, 9)
    assert recording_of(broken, 3).messages == []


def test_render_trajectory_is_compact_and_bounded(task_44: RecordedTrajectory) -> None:
    text = render_trajectory(task_44.messages, query=task_44.query)
    assert "You are an AI Agent" not in text, "the system prompt is left out"
    assert task_44.query not in text
    assert "### Assistant (turn 1)" in text and "### Code interpreter output" in text
    assert "[INFO]This is a Code Interpreter Message" not in text

    huge = [{"role": "user", "content": "q"}] + [
        {"role": "assistant", "content": f"step {i} " + "x" * 10_000} for i in range(40)
    ]
    huge.append({"role": "assistant", "content": "Finished: the answer is 42"})
    text = render_trajectory(huge, max_chars=5_000, max_message_chars=1_000)
    assert len(text) <= 5_000
    assert text.startswith("### User\nq") and text.endswith("Finished: the answer is 42")
    assert "characters cut" in text


def test_shorten_keeps_within_the_limit() -> None:
    text = "a" * 1000 + "b" * 1000
    for limit in (40, 100, 999, 1999):
        cut = shorten(text, limit)
        assert len(cut) <= limit and cut.startswith("a") and cut.endswith("b")
    assert shorten("short", 40) == "short"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1}', {"a": 1}),
        ('Here:\n```json\n{"a": 1}\n```', {"a": 1}),
        ('```\n{"a": {"b": [1, 2]}}\n```', {"a": {"b": [1, 2]}}),
        ('The verdict is {"a": "}"} as asked.', {"a": "}"}),
        ('<think>{oops}</think> {"a": 2}', {"a": 2}),
        ("[1, 2]", None),
        ("no json at all", None),
    ],
)
def test_extract_json_object(text: str, expected: dict[str, Any] | None) -> None:
    assert extract_json_object(text) == expected


def test_programming_errors_raise(make_judge: MakeJudge, task_44: RecordedTrajectory) -> None:
    with pytest.raises(TypeError, match="SecretStr"):
        make_judge(api_key=CANARY)
    with pytest.raises(ValueError, match="http"):
        make_judge(base_url="127.0.0.1:8000")
    judge = make_judge()
    with pytest.raises(TypeError, match="query"):
        judge.judge_absolute(None, task_44.messages)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="message"):
        judge.judge_absolute(task_44.query, ["not a message"])
    with pytest.raises(TypeError, match="sequence"):
        judge.judge_absolute(task_44.query, "a string")
    with pytest.raises(ValueError):
        prompt_hash("best-of-three")


def test_prompt_templates_take_their_fields() -> None:
    assert "{query}" in ABSOLUTE_USER_TEMPLATE and "{trajectory}" in ABSOLUTE_USER_TEMPLATE
    assert all(f"{{{name}}}" in PAIRWISE_USER_TEMPLATE for name in ("query", "reference", "candidate"))
    assert len({prompt_hash(mode) for mode in JudgeMode}) == 2


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "text",
    [
        "<think>" * 150_000 + '{"a": 1}',  # every block unclosed: a regular expression read to the end from each
        '{"a": ' * 100_000 + "1",  # nested past the decoder's depth, never closed
        "{" * 500_000,  # an object tried at every brace
        "```json\n" * 100_000,
    ],
    ids=["unclosed-think", "deep-nesting", "braces", "unclosed-fences"],
)
def test_hostile_answers_are_read_in_bounded_time(text: str) -> None:
    """An answer made to be slow to read, or to crash the reader, is read once: ``extract_json_object`` returns
    (an object or None) and raises nothing."""
    found = extract_json_object(text)
    assert found is None or found == {"a": 1}


def test_an_object_after_an_unclosed_think_block_is_still_found() -> None:
    assert extract_json_object('<think>a</think> <think> unclosed {"a": 1}') == {"a": 1}
    assert extract_json_object('<THINK>{"a": 0}</THINK> {"a": 1}') == {"a": 1}
