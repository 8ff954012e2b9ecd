"""One task session end to end through the executor's job: real Redis, a real sandbox container, the real
replay model server on loopback."""

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

from executor.jobs import execute_session
from executor.messages import INTERPRETER_PREFIX, opening_messages
from replay.server import create_app
from services.evaluation import Evaluation, ModelEndpoint, Sampling, TaskState
from services.lifecycle import TaskLifecycle
from services.pybench.recordings import recording_of
from services.pybench.suite import load_suite
from services.queues import GRADING_QUEUE, GradeJob, SessionJob, grade_job_id
from services.sandbox.docker import DockerSandboxBackend
from services.state import StateStore
from services.store import ArtifactStore
from services.trajectory import EndReason
from tests.fixtures import docker_executor_settings, test_secrets
from tests.servers import free_port, serve

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def replay_url(suite_path: Path) -> Iterator[str]:
    with serve(create_app(suite_path / "trajectory.jsonl")) as url:
        yield url + "/v1"


RunSession = Callable[..., tuple[dict[str, object], Evaluation]]


@pytest.fixture()
def run_session(
    redis_url: str, redis_client: Redis, suite_path: Path, tmp_path: Path, sandbox_network: str
) -> RunSession:
    """Run the executor job for one task against a model URL; returns the job's summary and the evaluation."""

    def run(
        index: int, model_url: str, max_turns: int = 10, api_key: str | None = None, key_held: bool = True
    ) -> tuple[dict[str, object], Evaluation]:
        settings = docker_executor_settings(redis_url, suite_path, tmp_path, sandbox_network)
        evaluation = Evaluation(
            id=f"sess{index}",
            model=ModelEndpoint(base_url=model_url, model="pybench-replay"),
            suite="pybench",
            tasks=[index],
            max_turns=max_turns,
            cell_timeout_s=120,
            prompt="gpt",
            sampling=Sampling(),
            has_api_key=api_key is not None,
        )
        TaskLifecycle(redis_client, test_secrets()).create(
            evaluation, load_suite(suite_path), api_key=api_key if key_held else None
        )
        summary = execute_session(
            SessionJob(evaluation_id=evaluation.id, task_index=index),
            settings=settings,
            redis=redis_client,
            backend=DockerSandboxBackend(network=sandbox_network),
        )
        return summary, evaluation

    return run


def test_a_recorded_session_replays_through_a_sandbox_of_its_own(
    run_session: RunSession, redis_client: Redis, suite_path: Path, tmp_path: Path, replay_url: str
) -> None:
    summary, evaluation = run_session(44, replay_url)
    trajectory = ArtifactStore(tmp_path).get_trajectory(evaluation.id, 44, 1)
    suite = load_suite(suite_path)
    opening = opening_messages(suite.system_prompt("gpt"), suite.task(44))
    assert trajectory.messages[: len(opening)] == opening
    expected = recording_of(suite_path / "trajectory.jsonl", 44).replies
    assert [m.content for m in trajectory.messages if m.role == "assistant"] == expected
    for message in trajectory.messages[len(opening) :]:
        assert message.role == "assistant" or message.content.startswith(INTERPRETER_PREFIX)
    assert trajectory.end_reason is EndReason.NO_CODE
    assert "./output/44.png" in trajectory.output_files
    assert (tmp_path / "evaluations" / evaluation.id / "tasks/44/attempt-1/output/44.png").read_bytes()[:4] == (
        b"\x89PNG"
    )
    # The sandbox that ran it is recorded and gone.
    assert trajectory.session is not None and summary["sandbox_id"] == trajectory.session.sandbox_id
    with pytest.raises(docker.errors.NotFound):
        docker.from_env().containers.get(trajectory.session.sandbox_id)
    # Grading is enqueued under its deterministic id, and the task waits for it.
    grade = GradeJob(evaluation_id=evaluation.id, task_index=44)
    queue = Queue(GRADING_QUEUE, connection=redis_client, serializer=JSONSerializer)
    assert queue.job_ids == [grade_job_id(grade)]
    assert StateStore(redis_client).task_states(evaluation.id) == {44: TaskState.GRADING}


def test_a_folder_the_session_leaves_empty_is_kept_as_its_result(
    run_session: RunSession, tmp_path: Path, replay_url: str
) -> None:
    """Task 140 asks for a game "saved to a folder ./output/140/"; the recorded run made the folder and wrote
    nothing in it, and the suite's check (dir_exists) passes an empty folder."""
    _, evaluation = run_session(140, replay_url)
    trajectory = ArtifactStore(tmp_path).get_trajectory(evaluation.id, 140, 1)
    assert "./output/140/" in trajectory.output_files
    assert "./output/140/" in ArtifactStore(tmp_path).list_output_files(evaluation.id, 140, 1)
    assert (tmp_path / "evaluations" / evaluation.id / "tasks/140/attempt-1/output/140").is_dir()


def test_turn_limit_ends_the_session(run_session: RunSession, tmp_path: Path, replay_url: str) -> None:
    summary, evaluation = run_session(7, replay_url, max_turns=1)
    trajectory = ArtifactStore(tmp_path).get_trajectory(evaluation.id, 7, 1)
    assert trajectory.end_reason is EndReason.MAX_TURNS and summary["turns"] == 1
    assert trajectory.messages[-1].content.startswith(INTERPRETER_PREFIX)


def test_an_unreachable_model_is_an_infrastructure_error_and_leaves_no_container(
    run_session: RunSession, tmp_path: Path
) -> None:
    _, evaluation = run_session(7, f"http://127.0.0.1:{free_port()}/v1")
    trajectory = ArtifactStore(tmp_path).get_trajectory(evaluation.id, 7, 1)
    assert trajectory.end_reason is EndReason.MODEL_ERROR and "did not answer" in (trajectory.error or "")
    assert not docker.from_env().containers.list(all=True, filters={"label": "pybench-eval.evaluation=sess7"})


CANARY = "sk-canary-model-key-7d41e0"


@pytest.fixture()
def echoing_model() -> Iterator[tuple[str, list[str]]]:
    """A hostile endpoint: it answers 400 with the request's Authorization header in its body."""
    seen: list[str] = []
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def complete(request: Request) -> JSONResponse:
        header = request.headers.get("authorization", "")
        seen.append(header)
        return JSONResponse({"error": {"message": f"bad request from {header}"}}, status_code=400)

    with serve(app) as url:
        yield url + "/v1", seen


def redis_dump(redis: Redis) -> bytes:
    """Every value in Redis but the secret store's, as bytes."""
    parts = []
    for key in redis.scan_iter("*"):
        if key.startswith(b"pbe:secret:"):
            continue
        kind = redis.type(key)
        if kind == b"string":
            parts.append(redis.get(key) or b"")
        elif kind == b"hash":
            parts.extend(k + b"=" + v for k, v in redis.hgetall(key).items())
        elif kind == b"list":
            parts.extend(redis.lrange(key, 0, -1))
        elif kind == b"set":
            parts.extend(redis.smembers(key))
        elif kind == b"zset":
            parts.extend(redis.zrange(key, 0, -1))
        parts.append(key)
    return b"\n".join(parts)


def test_the_model_key_reaches_the_endpoint_and_nothing_else(
    run_session: RunSession,
    redis_client: Redis,
    tmp_path: Path,
    echoing_model: tuple[str, list[str]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    url, seen = echoing_model
    caplog.set_level(logging.DEBUG)
    _, evaluation = run_session(7, url, api_key=CANARY)
    assert seen and all(header == f"Bearer {CANARY}" for header in seen)
    trajectory = ArtifactStore(tmp_path).get_trajectory(evaluation.id, 7, 1)
    assert trajectory.end_reason is EndReason.MODEL_REJECTED and "[REDACTED]" in (trajectory.error or "")
    stored = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert CANARY.encode() not in stored, "the key reached the artifact store"
    assert CANARY.encode() not in redis_dump(redis_client), "the key reached Redis outside the secret store"
    assert CANARY not in caplog.text, "the key reached a log"
    name = f"pbe:secret:model-key:{evaluation.id}"
    sealed = redis_client.get(name)
    assert sealed is not None and test_secrets().open(sealed, name) == CANARY  # held sealed, never in plain text


def test_a_session_whose_model_key_is_gone_never_calls_the_endpoint(
    run_session: RunSession, redis_client: Redis, tmp_path: Path, echoing_model: tuple[str, list[str]]
) -> None:
    """Restored from the store after Redis lost its state, an evaluation submitted with a key has none: its
    sessions stop before the model is called (or a sandbox started), with a model error that says what to do."""
    url, seen = echoing_model
    summary, evaluation = run_session(7, url, api_key=CANARY, key_held=False)
    assert seen == [], "the endpoint was called without the key the evaluation was submitted with"
    assert summary["sandbox_id"] is None and summary["turns"] == 0
    trajectory = ArtifactStore(tmp_path).get_trajectory(evaluation.id, 7, 1)
    assert trajectory.end_reason is EndReason.KEY_LOST and trajectory.session is None
    assert f"PUT /v1/evaluations/{evaluation.id}/keys" in (trajectory.error or "")
    assert StateStore(redis_client).task_states(evaluation.id) == {7: TaskState.GRADING}  # graded as infra_error


def test_a_running_session_of_a_cancelled_evaluation_stops_before_its_next_turn(
    run_session: RunSession, redis_url: str, redis_client: Redis, tmp_path: Path
) -> None:
    """The model is asked once; while it answers, the evaluation is cancelled: the cell of that turn runs, then
    the session stops instead of asking again, its task ``cancelled`` and not graded."""
    app = FastAPI()
    asked: list[int] = []

    @app.post("/v1/chat/completions")
    async def complete(request: Request) -> JSONResponse:
        asked.append(1)
        TaskLifecycle(Redis.from_url(redis_url)).cancel("sess7")
        reply = "Action:\n```python\nprint(6 * 7)\n```"
        return JSONResponse(
            {
                "choices": [{"message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5},
            }
        )

    with serve(app) as url:
        summary, evaluation = run_session(7, url + "/v1")
    assert asked == [1] and summary["cancelled"] is True
    trajectory = ArtifactStore(tmp_path).get_trajectory(evaluation.id, 7, 1)
    assert trajectory.end_reason is EndReason.CANCELLED and len(trajectory.turns) == 1
    assert trajectory.messages[-1].content == INTERPRETER_PREFIX + "42\n"
    assert StateStore(redis_client).task_states(evaluation.id) == {7: TaskState.CANCELLED}
    assert Queue(GRADING_QUEUE, connection=redis_client, serializer=JSONSerializer).count == 0
    assert not docker.from_env().containers.list(all=True, filters={"label": "pybench-eval.evaluation=sess7"})
