"""The whole stack through docker compose: tasks submitted over REST run in sandboxes of their own against
the replay model, are graded, and leave no sandbox behind."""

import json
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import docker
import httpx
import pytest

from executor.messages import INTERPRETER_PREFIX, opening_messages
from executor.pool import POOL_EVALUATION
from gateway.client import GatewayClient, GatewayError
from services.pybench.suite import load_suite
from services.sandbox.contract import EVALUATION_LABEL, ROLE_LABEL, SANDBOX_ROLE
from tests.fixtures import compose_stack, sandbox_objects

pytestmark = [pytest.mark.compose, pytest.mark.docker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent

STACK = "pbe-e2e"
TASKS = [13, 30, 44, 77, 79, 134]
"""Five tasks whose recorded trajectories succeed, across four categories, and task 13 whose input is missing.
Task 79's check (image_size) opens the produced image: it runs in a grading sandbox started by the grader."""

RUN = [t for t in TASKS if t != 13]

EXECUTORS = 2
"""Executor replicas in the stack."""

WARM_POOL_SIZE = 2
"""Sandboxes each executor keeps ready."""

ADMIN_KEY = "pbe-e2e-admin-" + secrets.token_urlsafe(16)


@pytest.fixture(scope="module")
def stack(suite_path: Path) -> Iterator[str]:
    """The stack's gateway URL (JSON log lines on)."""
    before = sandbox_objects()
    variables = {
        "PBE_EXECUTORS": str(EXECUTORS),
        "PBE_WARM_POOL_SIZE": str(WARM_POOL_SIZE),
        "PBE_LOG_FORMAT": "json",
        "PBE_REPLAY_SEED_SPLIT": "1",  # odd seeds give up: epochs with their own seeds differ
    }
    with compose_stack(STACK, suite_path, ADMIN_KEY, **variables) as url:
        yield url
    # The executors' warm sandboxes go with them: no sandbox object of the project (any role, any evaluation
    # label, warm-pool included) is left that was not there before the stack started.
    left = {key: labels for key, labels in sandbox_objects().items() if key not in before}
    assert left == {}, f"sandbox containers or volumes left after the stack stopped: {left}"


@pytest.fixture(scope="module")
def gateway(stack: str) -> Iterator[GatewayClient]:
    with GatewayClient(stack, api_key=ADMIN_KEY) as client:
        yield client


def _worker_metrics(service: str, index: int) -> str:
    """The Prometheus text a worker replica serves on its PBE_METRICS_PORT, read from inside its container where it
    serves them (its address on the route to Redis)."""
    done = subprocess.run(
        ["docker", "compose", "-p", STACK, "exec", "-T", "--index", str(index), service, "python3", "-m",
         "services.observability.monitoring"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def _total(text: str, name: str, **labels: str) -> float:
    """The sum of a series over every label set that includes ``labels``."""
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
        if all(w in line for w in wanted)
    )


def test_tasks_submitted_over_rest_run_each_in_its_own_sandbox_and_are_graded(
    gateway: GatewayClient, stack: str, suite_path: Path
) -> None:
    before = sandbox_objects()
    view = gateway.submit(
        {
            "model": {"base_url": "http://replay:8000/v1", "model": "pybench-replay"},
            "tasks": TASKS,
            "prompt": "gpt",
            "preflight": False,  # the replay model answers the suite's tasks only
        }
    )
    evaluation_id = view["evaluation"]["id"]
    assert view["evaluation"]["unavailable_tasks"] == [13]
    final = gateway.wait(evaluation_id, timeout_s=600)
    assert final["progress"]["total"] == len(TASKS)

    results = gateway.results(evaluation_id)
    verdicts = {v["task_index"]: v for v in results["verdicts"]}
    assert sorted(verdicts) == TASKS
    assert verdicts[13]["status"] == "unavailable"
    for index in RUN:
        assert verdicts[index]["status"] == "passed", verdicts[index]
        assert verdicts[index]["fixed"]["status"] == "passed", verdicts[index]
    assert [c["kind"] for c in verdicts[79]["checks"]] == ["image_size"] and verdicts[79]["checks"][0]["passed"]
    assert results["metrics"]["fixed"]["passed"] == 5
    assert results["complete"] and results["metrics"]["tasks"] == len(TASKS)
    assert results["metrics"]["passed"] == 5

    # Operators see the run: the gateway's series, each worker's, and JSON log lines that name the session.
    gateway_metrics = httpx.get(f"{stack}/metrics", timeout=10).text
    assert _total(gateway_metrics, "pbe_tasks", state="done") >= len(RUN)
    assert _total(gateway_metrics, "pbe_http_requests_total", route="/v1/evaluations", status="201") >= 1
    executors = "".join(_worker_metrics("executor", i) for i in range(1, EXECUTORS + 1))
    assert _total(executors, "pbe_sessions_total", end_reason="no_code") >= len(RUN)
    assert _total(executors, "pbe_sandbox_start_seconds_count") >= len(RUN)
    assert _total(executors, "pbe_cell_duration_seconds_count") >= len(RUN)
    graders = "".join(_worker_metrics("grader", i) for i in (1, 2))
    assert _total(graders, "pbe_gradings_total", status="passed") >= len(RUN)
    logs = subprocess.run(
        ["docker", "compose", "-p", STACK, "logs", "--no-color", "--no-log-prefix", "executor"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    ).stdout  # fmt: skip
    lines = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    ours = [line for line in lines if line.get("evaluation") == evaluation_id]
    assert {line["task"] for line in ours} >= set(RUN) and all(line["attempt"] >= 1 for line in ours)

    suite = load_suite(suite_path)
    sandboxes, names = set(), set()
    for index in RUN:
        trajectory = gateway.trajectory(evaluation_id, index)
        opening = [m.model_dump() for m in opening_messages(suite.system_prompt("gpt"), suite.task(index))]
        assert trajectory["messages"][: len(opening)] == opening
        for message in trajectory["messages"][len(opening) :]:
            assert message["role"] == "assistant" or message["content"].startswith(INTERPRETER_PREFIX)
        assert trajectory["end_reason"] == "no_code"
        sandboxes.add(trajectory["session"]["sandbox_id"])
        names.add(trajectory["session"]["sandbox_name"])
        assert verdicts[index]["sandbox_id"] == trajectory["session"]["sandbox_id"]
    assert len(sandboxes) == 5, "each task session runs in a container of its own"

    # What served the tasks is gone, container and volume, and nothing was left since the submission (whatever
    # its evaluation label: most sessions run in warm sandboxes, labelled for the pool) but the pools' next
    # sandboxes, up to WARM_POOL_SIZE per executor, each with its volume.
    after = sandbox_objects()
    assert not [key for key in after if key[1].startswith(tuple(names))], "a sandbox that served a task is left"
    new = {key: labels for key, labels in after.items() if key not in before}
    warm = [
        name
        for (kind, name), labels in new.items()
        if kind == "container"
        and labels.get(ROLE_LABEL) == SANDBOX_ROLE
        and labels.get(EVALUATION_LABEL) == POOL_EVALUATION
    ]
    assert len(warm) <= EXECUTORS * WARM_POOL_SIZE, f"more warm sandboxes than the pools hold: {warm}"
    left = {
        key: labels
        for key, labels in new.items()
        if not (labels.get(EVALUATION_LABEL) == POOL_EVALUATION and key[1].startswith(tuple(warm)))
    }
    assert left == {}, f"sandbox containers or volumes left after the evaluation: {left}"
    engine = docker.from_env()  # grading sandboxes are among `left`: none of this evaluation's is there
    for sandbox_id in sandboxes:
        with pytest.raises(docker.errors.NotFound):
            engine.containers.get(sandbox_id)


def _run_in(service: str, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``argv`` run in the stack's first ``service`` container (``env``: variables set for it)."""
    options = [arg for name, value in (env or {}).items() for arg in ("-e", f"{name}={value}")]
    return subprocess.run(
        ["docker", "compose", "-p", STACK, "exec", "-T", *options, service, *argv],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


REACH = """
import socket, sys
host = sys.argv[1]
try:
    address = socket.gethostbyname(host)
except OSError as exc:
    print(f"unresolved {exc}")
    address = host
try:
    socket.create_connection((address, 6379), timeout=3).close()
    print("connected")
except OSError as exc:
    print(f"refused {exc}")
"""


def test_redis_answers_only_with_its_password_and_model_servers_cannot_reach_it(stack: str) -> None:
    """Redis is the root of trust: without the password it answers NOAUTH and nothing else, the password is on
    no command line, and a model server (which runs what nobody vetted) has no route to it, by name or address."""
    assert _run_in("redis", "redis-cli", "ping", env={"REDISCLI_AUTH": ""}).stdout.strip().startswith("NOAUTH")
    refused = _run_in("redis", "redis-cli", "set", "pwned", "1", env={"REDISCLI_AUTH": ""})
    assert refused.stdout.strip().startswith("NOAUTH"), refused
    assert _run_in("redis", "redis-cli", "ping").stdout.strip() == "PONG"  # with the container's own password
    password = _run_in("redis", "sh", "-c", "echo $PBE_REDIS_PASSWORD").stdout.strip()
    assert len(password) >= 16
    for service, program in (("redis", "redis-server"), ("executor", "rq"), ("grader", "rq"), ("gateway", "uvicorn")):
        commands = _run_in(service, "sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
        assert program in commands.stdout, commands
        assert password not in commands.stdout, f"the Redis password is on a command line in {service}"
    address = _run_in("executor", "python3", "-c", "import socket; print(socket.gethostbyname('redis'))").stdout.strip()
    assert address.count(".") == 3
    by_name = _run_in("replay", "python3", "-c", REACH, "redis").stdout
    assert "unresolved" in by_name and "connected" not in by_name, by_name
    by_address = _run_in("replay", "python3", "-c", REACH, address).stdout
    assert by_address.startswith("refused"), by_address
    assert "PBE_REDIS" not in _run_in("replay", "env").stdout


PROBE_METRICS = """
import socket, subprocess
for address in subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split():
    try:
        socket.create_connection((address, 9100), timeout=3).close()
        print(address, "serves")
    except OSError:
        print(address, "refuses")
"""


def test_executor_metrics_are_served_on_the_services_network_only(stack: str) -> None:
    """An executor shares a network with its sandboxes: its metrics listen only on its address towards Redis, so
    on the sandboxes' network the port refuses."""
    answers = dict(line.split() for line in _run_in("executor", "python3", "-c", PROBE_METRICS).stdout.splitlines())
    assert len(answers) >= 3, answers  # the services', the sandboxes' and the models' networks
    assert list(answers.values()).count("serves") == 1, answers


def test_three_epochs_differ_by_seed_and_a_regrade_starts_no_session(gateway: GatewayClient) -> None:
    """Seeds 0, 1, 2: the replay gives up on the odd one, so each task passes in epochs 1 and 3 and fails in 2:
    mean 2/3 with no spread between tasks, pass@2 = 1 - C(1,2)/C(3,2) = 1, pass^2 = C(2,2)/C(3,2) = 1/3."""
    tasks = [30, 44, 77]
    body = {"model": {"base_url": "http://replay:8000/v1", "model": "pybench-replay"}, "tasks": tasks,
            "prompt": "gpt", "preflight": False, "epochs": 3, "sampling": {"seed": 0}}  # fmt: skip
    run_id = gateway.submit(body)["evaluation"]["id"]
    epochs = gateway.epochs(run_id)["epochs"]
    assert [e["seed"] for e in epochs] == [0, 1, 2]
    for epoch in epochs:
        gateway.wait(epoch["evaluation_id"], timeout_s=600)
    run = gateway.epochs(run_id)
    assert run["complete"]
    for epoch in run["epochs"]:
        statuses = {v["status"] for v in gateway.results(epoch["evaluation_id"])["verdicts"]}
        assert statuses == ({"failed"} if epoch["seed"] % 2 else {"passed"}), (epoch, statuses)
    overall = run["statistics"]["original"]["all"]
    assert overall["mean"] == pytest.approx(2 / 3, abs=1e-6) and overall["standard_error"] == 0
    assert (overall["ci_low"], overall["ci_high"]) == (pytest.approx(2 / 3, abs=1e-6), pytest.approx(2 / 3, abs=1e-6))
    assert overall["pass_at_k"] == {"1": pytest.approx(2 / 3, abs=1e-6), "2": 1.0, "3": 1.0}
    assert overall["pass_hat_k"] == {"1": pytest.approx(2 / 3, abs=1e-6), "2": pytest.approx(1 / 3, abs=1e-6),
                                     "3": 0.0}  # fmt: skip

    first = run["epochs"][0]["evaluation_id"]
    sessions_before = sum(_total(_worker_metrics("executor", i), "pbe_sessions_total") for i in (1, 2))
    regraded = gateway.regrade(first)
    assert regraded["evaluation"]["grading"] == 2
    gateway.wait(first, timeout_s=300)
    verdicts = gateway.results(first)["verdicts"]
    assert {v["grading"] for v in verdicts} == {2} and {v["status"] for v in verdicts} == {"passed"}
    sessions_after = sum(_total(_worker_metrics("executor", i), "pbe_sessions_total") for i in (1, 2))
    assert sessions_after == sessions_before, "a regrade starts no session"


def test_bad_requests_get_problem_documents(gateway: GatewayClient) -> None:
    with pytest.raises(GatewayError) as unknown:
        gateway.submit({"model": {"base_url": "http://replay:8000/v1", "model": "m"}, "tasks": [99999]})
    assert unknown.value.status == 422 and "99999" in str(unknown.value)
    with pytest.raises(GatewayError) as missing:
        gateway.evaluation("nosuchevaluation")
    assert missing.value.status == 404
