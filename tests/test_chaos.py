"""Chaos against the compose stack (``pytest -m chaos``): while an evaluation runs, executors are killed in the
middle of sessions, Redis is restarted and killed, graders are killed as a grading starts, and sandboxes are
killed. Each time the evaluation completes soon after the last blow, with exactly one verdict per task, no
container or volume left behind, and the gateway's reconciler alive.

The stack is the shipped ``docker-compose.yml`` under a project name of its own, with a replay model that takes
a second per answer (so sessions last long enough to be hit), a reconciler pass every few seconds, and two
executors of eight sessions each. A summary table of the recoveries is printed (``-s`` shows it) and written to
``var/chaos-summary.txt``.
"""

import contextlib
import os
import secrets
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from gateway.client import GatewayClient, GatewayError, GatewayUnreachableError
from services.pybench.suite import load_suite
from services.sandbox.contract import (
    DEFAULT_SANDBOX_IMAGE,
    EVALUATION_LABEL,
    GRADING_ROLE,
    ROLE_LABEL,
    SANDBOX_ROLE,
    WORKER_LABEL,
)
from services.sandbox.runtime_volumes import RuntimeVolumes, marker_name
from tests.fixtures import compose_stack, sandbox_objects, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.compose, pytest.mark.docker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
STACK = "pbe-chaos"
ADMIN_KEY = "pbe-chaos-admin-" + secrets.token_urlsafe(16)
EXECUTORS = 2
WARM_POOL_SIZE = 2
RECOVERY_BOUND_S = 120.0
"""Every evaluation completes within this long after the last blow."""

TASKS = [44, 78, 79, 84, 85, 103, 112, 115, 118, 126, 134, 135, 29, 30, 33, 37]
"""Sixteen recorded tasks with their inputs, of two or three replies each."""


@dataclass
class Stack:
    client: GatewayClient
    url: str

    def containers(self, service: str) -> list[Any]:
        engine = docker.from_env()
        found = engine.containers.list(
            filters={"label": [f"com.docker.compose.project={STACK}", f"com.docker.compose.service={service}"]},
            ignore_removed=True,
        )
        return sorted(found, key=lambda c: c.name)

    def worker_ids(self) -> set[str]:
        """The executors' ids, as their sandboxes' worker label carries them (their host names)."""
        return {c.attrs["Config"]["Hostname"] for c in self.containers("executor")}


@pytest.fixture(scope="module")
def stack(suite_path: Path) -> Iterator[Stack]:
    variables = {
        "PBE_EXECUTORS": str(EXECUTORS),
        "PBE_SESSIONS_PER_WORKER": "8",
        "PBE_WARM_POOL_SIZE": str(WARM_POOL_SIZE),
        "PBE_REPLAY_LATENCY_S": "1",
        "PBE_RECONCILE_INTERVAL_S": "3",
    }
    grading_before = set(sandbox_objects(**{ROLE_LABEL: GRADING_ROLE}))
    with compose_stack(STACK, suite_path, ADMIN_KEY, **variables) as url:
        wait_for_runtime_copies()
        client = GatewayClient(url, api_key=ADMIN_KEY)
        yield Stack(client, url)
        client.close()
    # A grader killed between creating its grading sandbox and removing it leaves it behind, as a crash would:
    # `make reap` is the operator's safety net; here the suite removes what its own killed graders left.
    engine = docker.from_env()
    left = set(sandbox_objects(**{ROLE_LABEL: GRADING_ROLE})) - grading_before
    for kind, name in sorted(left, key=lambda item: item[0] != "container"):  # a volume goes once its container has
        with contextlib.suppress(docker.errors.NotFound):
            if kind == "container":
                engine.containers.get(name).remove(force=True)
            else:
                engine.volumes.get(name).remove(force=True)


def crash(container: Any) -> None:
    """Kill a container's main process with SIGKILL from the host, as a crash or the kernel's OOM killer would: its
    restart policy brings it back (a ``docker kill`` counts as a stop by hand, and nothing restarts it)."""
    container.reload()
    os.kill(int(container.attrs["State"]["Pid"]), signal.SIGKILL)


def restarted(container: Any, started_at: str) -> Callable[[], bool]:
    """Whether ``container`` runs again since it was started at ``started_at``."""

    def check() -> bool:
        container.reload()
        return bool(container.status == "running" and container.attrs["State"]["StartedAt"] != started_at)

    return check


def wait_for_runtime_copies() -> None:
    """On a FUSE engine, wait for the executors' first start to publish the sandbox image's runtime copies (once a
    machine: minutes on a fresh one); blows dealt before would cut every copy short and measure that instead."""
    engine = docker.from_env()
    if RuntimeVolumes(engine, "auto").enabled():
        marker = marker_name(str(engine.images.get(DEFAULT_SANDBOX_IMAGE).id))

        def published() -> bool:  # the engine's name filter matches a prefix: the copies' names too
            return any(volume.name == marker for volume in engine.volumes.list(filters={"name": marker}))

        wait_for(published, 600, "the runtime copies")
    engine.close()


def submit(stack: Stack) -> str:
    view = stack.client.submit(
        {
            "model": {"base_url": "http://replay:8000/v1", "model": "pybench-replay"},
            "tasks": TASKS,
            "prompt": "gpt",
            "preflight": False,
            "max_concurrency": 8,
        }
    )
    return str(view["evaluation"]["id"])


def ask(call: Callable[[], Any]) -> Any:
    """A gateway call, asked again for up to a minute while the gateway answers 5xx or nothing (Redis is away for a
    moment after a blow to it: the gateway says so, it does not wait) or 429 (the key's requests a minute)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return call()
        except GatewayUnreachableError:
            pause = 0.5
        except GatewayError as exc:
            if exc.status != 429 and exc.status < 500:
                raise
            pause = 3.0 if exc.status == 429 else 0.5
        assert time.monotonic() < deadline, "the gateway did not answer within a minute"
        time.sleep(pause)


def target(stack: Stack, evaluations: list[str], state: str) -> None:
    """Wait until the phase's newest evaluation has a task in ``state`` (``running``, ``grading``); one that
    completed before all the phase's blows were dealt is followed by a new one. Answers the gateway could not give
    while Redis was away are asked again."""
    deadline = time.monotonic() + 120
    while True:
        assert time.monotonic() < deadline, f"no task {state} in 120 s"
        view = ask(lambda: stack.client.evaluation(evaluations[-1]))
        if view["progress"]["counts"].get(state, 0) > 0:
            return
        if view["status"] == "completed":
            evaluations.append(ask(lambda: submit(stack)))
        time.sleep(1.0)  # the admin key may make 120 requests a minute


@dataclass
class Recovery:
    blow: str
    count: int
    evaluations: int
    completed_after_last_s: float
    attempts_max: int
    infra_errors: int


def finish(stack: Stack, evaluations: list[str], blow: str, blows: int, last_blow: float) -> Recovery:
    """Wait for the phase's evaluations to complete (within ``RECOVERY_BOUND_S`` of the last blow) and check each
    and what they left."""
    deadline = last_blow + RECOVERY_BOUND_S
    while any(ask(lambda e=e: stack.client.evaluation(e))["status"] != "completed" for e in evaluations):
        assert time.monotonic() < deadline, f"{blow}: not complete {RECOVERY_BOUND_S:.0f} s after the last blow"
        time.sleep(1.0)
    recovered = time.monotonic() - last_blow
    attempts, infra = 0, 0
    for evaluation_id in evaluations:
        results = ask(lambda e=evaluation_id: stack.client.results(e))
        indexes = [v["task_index"] for v in results["verdicts"]]
        assert sorted(indexes) == sorted(TASKS), f"{blow}: lost or duplicated verdicts: {sorted(indexes)}"
        assert results["complete"]
        statuses = {v["task_index"]: v["status"] for v in results["verdicts"]}
        # the environment broke, the agent did not: nothing is graded for it but its own work or infra_error
        assert all(s in ("passed", "failed", "infra_error") for s in statuses.values()), statuses
        attempts = max(attempts, *(v["attempt"] for v in results["verdicts"]))
        infra += sum(1 for s in statuses.values() if s == "infra_error")
        assert_nothing_left(stack, evaluation_id)
    health = httpx.get(stack.url + "/health", timeout=10)
    assert health.status_code == 200 and health.json() == {"status": "ok"}, health.text  # the reconciler lives
    return Recovery(blow, blows, len(evaluations), round(recovered, 1), attempts, infra)


def assert_nothing_left(stack: Stack, evaluation_id: str) -> None:
    """No sandbox of the evaluation, and of the stack's executors no more than their warm pools (each worker's
    previous life was swept when it started again); no volume without its container."""

    def clean() -> bool:
        left = 0
        for worker in stack.worker_ids():
            objects = sandbox_objects(**{WORKER_LABEL: worker})
            boxes = {key: labels for key, labels in objects.items() if key[0] == "container"}
            warm = [key for key, labels in boxes.items() if labels[ROLE_LABEL] == SANDBOX_ROLE]
            left += max(0, len(warm) - WARM_POOL_SIZE)
            names = {name for _, name in warm}
            left += sum(1 for kind, name in objects if kind == "volume" and name not in names)
        left += len(sandbox_objects(**{EVALUATION_LABEL: evaluation_id}))
        return left == 0

    wait_for(clean, 60, "the sandboxes of killed sessions and workers to be removed")


def test_killed_executors_redis_graders_and_sandboxes_lose_nothing_and_leave_nothing(stack: Stack) -> None:
    recoveries: list[Recovery] = []
    engine = docker.from_env()

    # five executors killed in the middle of sessions
    evaluations = [submit(stack)]
    for blow in range(5):
        target(stack, evaluations, "running")
        victim = stack.containers("executor")[blow % EXECUTORS]
        started_at = victim.attrs["State"]["StartedAt"]
        crash(victim)
        last = time.monotonic()
        wait_for(restarted(victim, started_at), 60, "the executor's restart")
        time.sleep(3)
    recoveries.append(finish(stack, evaluations, "executor SIGKILL mid-session", 5, last))

    # Redis restarted, then killed outright (its append-only file keeps what it held)
    evaluations = [submit(stack)]
    for how in ("restart", "kill"):
        target(stack, evaluations, "running")
        (redis,) = stack.containers("redis")
        started_at = redis.attrs["State"]["StartedAt"]
        redis.restart(timeout=1) if how == "restart" else crash(redis)
        last = time.monotonic()
        wait_for(restarted(redis, started_at), 60, "Redis back")
        time.sleep(4)
    recoveries.append(finish(stack, evaluations, "Redis restart + SIGKILL", 2, last))

    # graders killed the moment a grading starts (one, then the other, while the first comes back)
    evaluations = [submit(stack)]
    graders = stack.containers("grader")  # both, while both run (a crashed one is not listed until it is back)
    victims = []
    for blow in range(2):
        target(stack, evaluations, "grading")
        victim = graders[blow]
        victims.append((victim, victim.attrs["State"]["StartedAt"]))
        crash(victim)
        last = time.monotonic()
    for victim, started_at in victims:
        wait_for(restarted(victim, started_at), 60, "the grader's restart")
    recoveries.append(finish(stack, evaluations, "grader SIGKILL at grading", 2, last))

    # sandboxes killed under running sessions
    evaluations = [submit(stack)]
    killed = 0
    while killed < 5:
        target(stack, evaluations, "running")
        workers = stack.worker_ids()
        boxes = [
            c
            for c in engine.containers.list(filters={"label": f"{ROLE_LABEL}={SANDBOX_ROLE}"}, ignore_removed=True)
            if c.labels.get(WORKER_LABEL) in workers
        ]
        if not boxes:
            continue
        # the oldest first: a pool's ready sandboxes are its newest, so the oldest serve sessions
        try:
            min(boxes, key=lambda c: c.attrs["Created"]).kill(signal="SIGKILL")
        except (docker.errors.NotFound, docker.errors.APIError):
            continue  # its session ended and removed it between the listing and the kill: pick again
        killed += 1
        last = time.monotonic()
        time.sleep(2)
    recoveries.append(finish(stack, evaluations, "sandbox SIGKILL", 5, last))

    table = [f"{'blow':<32}{'count':>6}{'evaluations':>12}{'complete after last s':>23}{'max attempt':>13}{'infra':>7}"]
    table += [
        f"{r.blow:<32}{r.count:>6}{r.evaluations:>12}{r.completed_after_last_s:>23}{r.attempts_max:>13}"
        f"{r.infra_errors:>7}"
        for r in recoveries
    ]
    (ROOT / "var").mkdir(exist_ok=True)
    (ROOT / "var" / "chaos-summary.txt").write_text("\n".join(table) + "\n")
    print("\n" + "\n".join(table))


def test_the_suite_names_every_chaos_task(suite_path: Path) -> None:
    suite = load_suite(suite_path)
    assert all(suite.task(i).available for i in TASKS)
