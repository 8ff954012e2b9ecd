"""Helpers shared by several test modules: a gateway's settings and a valid submission, a sign-in to the dashboard,
the project's sandbox objects on the Docker engine, the compose stack under a project name of a test's own, a task
run and graded by the real executor and grader jobs, and a wait for a condition. The records tests build (an
evaluation, a verdict, a trajectory ...) are in ``tests.factories``."""

import contextlib
import os
import re
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

from executor.settings import ExecutorSettings
from gateway.dashboard.access import LOGIN_COOKIE
from gateway.settings import GatewaySettings
from services.evaluation import Evaluation, TaskState
from services.lifecycle import TaskLifecycle
from services.live.secretbox import SecretBox
from services.pybench.suite import Suite
from services.queues import SESSIONS_QUEUE, GradeJob, SessionJob
from services.sandbox.contract import PROJECT, PROJECT_LABEL, ROLE_LABEL, RUNTIME_ROLES
from services.store import ArtifactStore
from services.verdict import Verdict

ROOT = Path(__file__).resolve().parent.parent

ADMIN_KEY = "pbe-test-admin-key-0f3a9c"
"""The operator's key of every gateway ``gateway_settings`` builds (sent as ``Authorization: Bearer``)."""

BODY = {"model": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}, "tasks": [7, 13, 16], "prompt": "gpt"}
"""A valid submission: tasks 7 and 16 run, task 13's input is missing (unavailable); nothing listens on port 9."""


def gateway_settings(redis_url: str, suite_path: Path, tmp_path: Path, **overrides: object) -> GatewaySettings:
    """Settings of a gateway on ``redis_url`` with the admin key ``ADMIN_KEY``, artifacts under ``tmp_path``,
    egress to 127.0.0.1 only, no reconciler and no preflight; ``overrides`` replace any of them by name."""
    values: dict[str, object] = {
        "REDIS_URL": redis_url,
        "SUITE_PATH": suite_path,
        "ARTIFACT_ROOT": tmp_path,
        "ADMIN_KEY": ADMIN_KEY,
        "EGRESS_ALLOWLIST": "127.0.0.1",
        "RECONCILE_INTERVAL_S": 0,
        "PREFLIGHT": False,
    }
    return GatewaySettings(**(values | overrides))  # type: ignore[arg-type]


def login_form_token(client: httpx.Client) -> str:
    """Open the dashboard's sign-in form as a browser does (its cookie is kept by ``client``); returns the form's
    CSRF value."""
    form = client.get("/dashboard/login")
    assert form.status_code == 200 and LOGIN_COOKIE in form.headers["set-cookie"]
    found = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert found is not None
    return found.group(1)


def sign_in(client: httpx.Client, key: str) -> str:
    """Sign ``client`` in to the dashboard with ``key`` through the sign-in form; returns the session's CSRF token
    read from a page."""
    login = {"key": key, "next": "/dashboard/runs", "csrf": login_form_token(client)}
    response = client.post("/dashboard/login", data=login)
    assert response.status_code == 303 and response.headers["location"] == "/dashboard/runs", response.text
    page = client.get("/dashboard/runs")
    assert page.status_code == 200
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found is not None
    return found.group(1)


def sandbox_objects(**labels: str) -> dict[tuple[str, str], dict[str, str]]:
    """Every container and volume on the Docker engine that carries the project label (``PROJECT_LABEL``)
    and ``labels`` (label key to value), whatever their role or evaluation: ``(kind, name)`` to its labels,
    kind ``container`` or ``volume``. What a test compares before and after, to find what was left behind."""
    import docker

    engine = docker.from_env()
    wanted = [f"{PROJECT_LABEL}={PROJECT}", *(f"{key}={value}" for key, value in labels.items())]
    found: dict[tuple[str, str], dict[str, str]] = {}
    # The low-level listings: one request each, so an object removed meanwhile cannot fail the listing.
    for container in engine.api.containers(all=True, filters={"label": wanted}):
        found["container", container["Names"][0].lstrip("/")] = dict(container.get("Labels") or {})
    for volume in engine.api.volumes(filters={"label": wanted}).get("Volumes") or []:
        if (volume.get("Labels") or {}).get(ROLE_LABEL) in RUNTIME_ROLES:
            continue  # the image's runtime copy: made once for every sandbox to come, not left behind
        found["volume", volume["Name"]] = dict(volume.get("Labels") or {})
    engine.close()
    return found


@contextlib.contextmanager
def compose_stack(project: str, suite_path: Path, admin_key: str, **variables: str) -> Iterator[str]:
    """The shipped ``docker-compose.yml`` up under the project name ``project`` (its networks named after it),
    the gateway on a free loopback port with ``admin_key``, the images already built; ``variables`` are more of
    the compose file's variables (``PBE_EXECUTORS`` ...). Yields the gateway's URL; afterwards writes the stack's
    logs to ``var/<project>-compose.log`` and takes it down with its volumes."""
    from tests.servers import free_port

    port = free_port()
    env = {
        **os.environ,
        "PBE_STACK": project,
        "PBE_GATEWAY_PORT": str(port),
        "PBE_SUITE_DIR": str(suite_path.resolve()),
        "DOCKER_GID": str(os.stat("/var/run/docker.sock").st_gid),
        "PBE_ADMIN_KEY": admin_key,
        "PBE_REDIS_PASSWORD": secrets.token_urlsafe(24),
        **variables,
    }

    def compose(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["docker", "compose", "-p", project, *args], cwd=ROOT, env=env, text=True, capture_output=True, timeout=600
        )

    up = compose("up", "-d", "--no-build", "--wait", "--wait-timeout", "180")
    try:
        assert up.returncode == 0, up.stderr + compose("logs", "--tail", "50").stdout
        yield f"http://127.0.0.1:{port}"
    finally:
        logs = compose("logs", "--no-color", "--tail", "300")
        (ROOT / "var").mkdir(exist_ok=True)
        (ROOT / "var" / f"{project}-compose.log").write_text(logs.stdout + logs.stderr)
        compose("down", "-v", "--remove-orphans")


def wait_for(condition: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.25) -> None:
    """Return once ``condition()`` is true, asking every ``interval_s``; fail saying ``what`` was awaited when it
    is still false after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting for {what}"
        time.sleep(interval_s)


def queued_ids(redis: Redis, queue: str) -> list[str]:
    """The ids of the jobs waiting in ``queue``, oldest first."""
    return Queue(queue, connection=redis, serializer=JSONSerializer).job_ids


def docker_executor_settings(redis_url: str, suite_path: Path, tmp_path: Path, network: str) -> ExecutorSettings:
    """Settings of an executor on ``redis_url`` whose sandboxes are Docker containers on ``network``, artifacts under
    ``tmp_path``, the model reached on 127.0.0.1 only."""
    return ExecutorSettings(
        REDIS_URL=redis_url,
        SUITE_PATH=suite_path,
        ARTIFACT_ROOT=tmp_path,
        SANDBOX_NETWORK=network,
        EGRESS_ALLOWLIST="127.0.0.1",
    )


def run_and_grade(
    evaluation: Evaluation, suite: Suite, redis_url: str, redis: Redis, tmp_path: Path, api_key: str | None = None
) -> Verdict:
    """Create the evaluation (keys held as given), run its one session with the executor's job on the local
    backend, and grade it with the grader's job; returns the task's recorded verdict."""
    from executor.jobs import execute_session
    from grader.jobs import grade_and_record
    from services.sandbox.registry import get_backend

    settings = ExecutorSettings(
        REDIS_URL=redis_url,
        SUITE_PATH=suite.root,
        ARTIFACT_ROOT=tmp_path,
        SANDBOX_BACKEND="local",
        SANDBOX_LOCAL_ROOT=str(tmp_path / "sandboxes"),
        EGRESS_ALLOWLIST="127.0.0.1",
        WARM_POOL=False,
    )
    lifecycle = TaskLifecycle(redis, test_secrets())
    lifecycle.create(evaluation, suite, api_key=api_key)
    [task] = evaluation.tasks
    execute_session(
        SessionJob(evaluation_id=evaluation.id, task_index=task),
        settings=settings,
        redis=redis,
        backend=get_backend(settings),
    )
    store = ArtifactStore(tmp_path)
    grade_and_record(GradeJob(evaluation_id=evaluation.id, task_index=task), redis=redis, suite=suite, store=store)
    [verdict] = lifecycle.state.verdicts(evaluation.id)
    assert lifecycle.state.task_states(evaluation.id) == {task: TaskState.DONE}
    assert not [j for j in queued_ids(redis, SESSIONS_QUEUE) if j.startswith(f"pbe-session-{evaluation.id}-")]
    return verdict


def test_secrets() -> SecretBox:
    """The box of the tests' ``PBE_SECRETS_KEY`` (conftest sets one for the whole run): what the services'
    settings make, so a key the tests hold is one the gateway and workers they start can open."""
    return SecretBox.from_setting(os.environ["PBE_SECRETS_KEY"])


test_secrets.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test
