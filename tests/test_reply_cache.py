"""Paying once: the reply cache (``services.live.replies``) and the evaluation's spend (``services.live.spend``)
against a
real Redis and a real model server on loopback; then a session whose sandbox is killed in its middle, retried
with the cache on, through the executor's job, a real sandbox container and the replay model."""

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import httpx
import jsonschema
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from redis import Redis

from executor.calls import SessionModel
from executor.jobs import execute_session
from executor.settings import ExecutorSettings
from grader.grading import grade
from replay.server import create_app
from services.endpoint.client import Completion, EndpointClient
from services.evaluation import Budgets, Evaluation, EvaluationCreate, ModelEndpoint, Prices, Sampling
from services.lifecycle import TaskLifecycle
from services.live.replies import MAX_CACHED_REPLY_BYTES, REPLY_TTL_S, ReplyCache, request_key
from services.live.spend import SpendLedger
from services.pybench.suite import load_suite
from services.queues import RETRIES_KEY, SessionJob
from services.sandbox.contract import EVALUATION_LABEL
from services.sandbox.docker import DockerSandboxBackend
from services.store import ArtifactStore
from services.trajectory import EndReason, Trajectory
from tests.fixtures import docker_executor_settings, test_secrets
from tests.servers import serve

OPENING = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]


class CountingServer:
    """Answers every request with the same reply and usage; counts the requests."""

    def __init__(self, prompt_tokens: int = 300, completion_tokens: int = 100) -> None:
        self.requests = 0
        self.usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def complete(request: Request) -> JSONResponse:
            await request.json()
            self.requests += 1
            choice = {"index": 0, "message": {"role": "assistant", "content": "```python\nprint(1)\n```"}}
            return JSONResponse({"id": "c", "object": "chat.completion", "choices": [choice], "usage": self.usage})

        return app


def _evaluation(url: str, **fields: object) -> Evaluation:
    values: dict[str, object] = {
        "id": "cache1",
        "model": ModelEndpoint(base_url=url, model="m"),
        "suite": "pybench",
        "tasks": [45],
        "max_turns": 10,
        "cell_timeout_s": 60,
        "prompt": "gpt",
        "sampling": Sampling(),
    }
    return Evaluation.model_validate(values | fields)


def test_the_request_key_changes_with_everything_that_decides_the_reply() -> None:
    base = request_key("http://a/v1", "m", OPENING, {"temperature": 0.2, "seed": 1}, None, 1)
    assert base == request_key("http://a/v1", "m", [dict(m) for m in OPENING], {"seed": 1, "temperature": 0.2}, None, 1)
    changed = [
        request_key("http://b/v1", "m", OPENING, {"temperature": 0.2, "seed": 1}, None, 1),
        request_key("http://a/v1", "n", OPENING, {"temperature": 0.2, "seed": 1}, None, 1),
        request_key("http://a/v1", "m", [*OPENING, {"role": "assistant", "content": "x"}], {"seed": 1}, None, 1),
        request_key("http://a/v1", "m", OPENING, {"temperature": 0.2, "seed": 2}, None, 1),
        request_key("http://a/v1", "m", OPENING, {"temperature": 0.2, "seed": 1}, [{"type": "function"}], 1),
        request_key("http://a/v1", "m", OPENING, {"temperature": 0.2, "seed": 1}, None, 2),
    ]
    assert len({base, *changed}) == 7


def test_kept_replies_come_back_marked_and_bad_entries_are_misses(redis_client: Redis) -> None:
    cache = ReplyCache(redis_client, "cache1")
    reply = Completion("hi", 3, 4, 0.5, "stop", tool_calls=[{"id": "c1", "function": {"name": "f"}}])
    assert cache.get("k") is None
    assert cache.put("k", reply)
    kept = cache.get("k")
    assert kept is not None and kept.replayed and kept.requests == 0
    assert (kept.text, kept.prompt_tokens, kept.completion_tokens, kept.tool_calls) == ("hi", 3, 4, reply.tool_calls)
    assert 0 < redis_client.ttl("pbe:evaluation:cache1:replies") <= REPLY_TTL_S
    # What does not read as a reply is a miss, never an error.
    for raw in (b"not json", b"[]", json.dumps({"text": 5, "tool_calls": []}).encode(), b'{"text": "x"}'):
        redis_client.hset("pbe:evaluation:cache1:replies", "bad", raw)
        assert cache.get("bad") is None
    # A reply over the bound is not kept.
    assert not cache.put("big", Completion("x" * MAX_CACHED_REPLY_BYTES, None, None, 0.0, None))
    assert cache.get("big") is None


def test_a_request_asked_again_is_replayed_and_only_paid_calls_are_charged(redis_client: Redis) -> None:
    server = CountingServer()
    with serve(server.app()) as url:
        evaluation = _evaluation(url + "/v1", prices=Prices(input_per_million=1000, output_per_million=1000))
        endpoint = EndpointClient(url + "/v1", "m", retries=0)
        model = SessionModel(
            endpoint, evaluation, replies=ReplyCache(redis_client, evaluation.id), ledger=SpendLedger(redis_client, "c")
        )
        first = model.complete(OPENING, {"seed": 3})
        again = model.complete(OPENING, {"seed": 3})
        other = model.complete(OPENING, {"seed": 4})
        endpoint.close()
    assert server.requests == 2, "the repeated request was not sent"
    assert (first.replayed, again.replayed, other.replayed) == (False, True, False)
    assert again.text == first.text and again.prompt_tokens == 300
    assert model.spent_usd() == pytest.approx(0.8), "two paid calls of 400 tokens at $1000 per million"


def test_a_cost_limit_needs_prices() -> None:
    body = {"model": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}, "budgets": {"max_cost_usd": 1}}
    with pytest.raises(ValidationError, match="max_cost_usd needs prices"):
        EvaluationCreate.model_validate(body)
    priced = EvaluationCreate.model_validate(body | {"prices": {"input_per_million": 1, "output_per_million": 2}})
    assert priced.budgets == Budgets(max_cost_usd=1)
    # the published schema says the same, so a client (or the API fuzzer) never sends what the validator refuses
    schema = jsonschema.Draft202012Validator(EvaluationCreate.model_json_schema())
    assert not schema.is_valid(body)
    assert schema.is_valid(body | {"prices": {"input_per_million": 1, "output_per_million": 2}})
    assert schema.is_valid(body | {"budgets": {"max_cost_usd": None}}) and schema.is_valid(body | {"budgets": None})


# --- a sandbox killed in the middle of a session, retried with the cache on ------------------------------------

TASK = 45
"""A recorded run of four turns whose cells print the same output each time they run."""

LATENCY_S = 1.5
"""Each replayed answer takes this long: the window in which the test kills the sandbox."""


@pytest.fixture(scope="module")
def slow_replay(suite_path: Path) -> Iterator[str]:
    with serve(create_app(suite_path / "trajectory.jsonl", latency_s=LATENCY_S)) as url:
        yield url


def _requests(url: str) -> int:
    return int(httpx.get(url + "/stats").json()["requests"])


def _kill_when(url: str, requests: int, evaluation_id: str, killed: list[str]) -> None:
    """Once the model got its ``requests``-th request (that call is in flight), kill the session's sandbox."""
    client = docker.from_env()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and _requests(url) < requests:
        time.sleep(0.05)
    for container in client.containers.list(filters={"label": f"{EVALUATION_LABEL}={evaluation_id}"}):
        container.kill(signal="SIGKILL")
        killed.append(container.id)


def _session(
    settings: ExecutorSettings, redis: Redis, network: str, evaluation_id: str, attempt: int
) -> tuple[Trajectory, list[str]]:
    execute_session(
        SessionJob(evaluation_id=evaluation_id, task_index=TASK, attempt=attempt),
        settings=settings,
        redis=redis,
        backend=DockerSandboxBackend(network=network),
    )
    trajectory = ArtifactStore(settings.ARTIFACT_ROOT).get_trajectory(evaluation_id, TASK, attempt)
    return trajectory, trajectory.output_files


@pytest.mark.docker
def test_a_session_retried_after_its_sandbox_died_pays_only_for_the_turns_that_remain(
    redis_client: Redis, redis_url: str, suite_path: Path, tmp_path: Path, sandbox_network: str, slow_replay: str
) -> None:
    settings = docker_executor_settings(redis_url, suite_path, tmp_path, sandbox_network)
    suite = load_suite(suite_path)
    lifecycle = TaskLifecycle(redis_client, test_secrets())
    for evaluation_id, cached in (("killed", True), ("clean", False)):
        lifecycle.create(_evaluation(slow_replay + "/v1", id=evaluation_id, reply_cache=cached), suite)

    # The clean run: what the task's session is when nothing goes wrong.
    httpx.post(slow_replay + "/stats/reset")
    clean, clean_files = _session(settings, redis_client, sandbox_network, "clean", 1)
    clean_calls = _requests(slow_replay)
    assert clean.end_reason is EndReason.NO_CODE and clean_calls == len(clean.turns) == 4

    # Attempt 1: the sandbox is killed while the second turn's model call is in flight; its cell cannot run.
    httpx.post(slow_replay + "/stats/reset")
    killed: list[str] = []
    killer = threading.Thread(target=_kill_when, args=(slow_replay, 2, "killed", killed))
    killer.start()
    first, _ = _session(settings, redis_client, sandbox_network, "killed", 1)
    killer.join()
    assert killed, "the sandbox was killed"
    assert first.end_reason is EndReason.SANDBOX_ERROR and first.end_reason.retryable
    assert len(first.turns) == 2 and _requests(slow_replay) == 2
    assert len(ReplyCache(redis_client, "killed")) == 2, "both paid replies are kept"
    # Its executor decided the retry where the session ended: no grading, attempt 2 scheduled, attempt 1's verdict kept.
    assert (tmp_path / "evaluations/killed/tasks/45/attempt-1/verdict.json").is_file()
    assert redis_client.zscore(
        RETRIES_KEY, SessionJob(evaluation_id="killed", task_index=TASK, attempt=2).model_dump_json()
    )

    # Attempt 2, in a fresh sandbox: both kept replies are replayed (their cells run again), the rest is asked.
    httpx.post(slow_replay + "/stats/reset")
    second, second_files = _session(settings, redis_client, sandbox_network, "killed", 2)
    assert _requests(slow_replay) == clean_calls - 2, "only the turns that remain were asked of the model"
    assert [t.replayed for t in second.turns] == [True, True, False, False]
    assert second.replayed_turns == 2 and second.replayed_tokens == sum(
        (t.prompt_tokens or 0) + (t.completion_tokens or 0) for t in first.turns
    )
    assert all(t.execution is not None for t in second.turns[:2]), "the replayed turns' cells ran again"
    # The retried session is the clean one: the same conversation, the same files, the same verdict.
    assert [m.content for m in second.messages] == [m.content for m in clean.messages]
    assert second_files == clean_files
    task = suite.task(TASK)
    clean_verdict, second_verdict = grade(task, clean, clean_files), grade(task, second, second_files)
    assert second_verdict.status == clean_verdict.status and second_verdict.reason == clean_verdict.reason
    assert (second_verdict.replayed_turns, clean_verdict.replayed_turns) == (2, 0)
