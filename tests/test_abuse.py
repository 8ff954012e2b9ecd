"""The abuse suite (``pytest -m abuse``): a misbehaving endpoint and hostile model code against the compose stack.

An endpoint of the suite's own (``tests/hostile_endpoint.py``) runs on the stack's model network, where the
services reach it as ``hostile``. It answers 256 MiB, drips a byte a second, nests JSON 100,000 deep, makes
malformed tool calls, and judges with 4 MiB of unclosed ``<think>``; the cells it sends flood the kernel's output
and the container's log, write a sparse 100 GiB file and 3,000 files, open sockets to their executor and send
kernel messages of odd shapes. Meanwhile another key runs replayed tasks, 20 event streams are held open, and
``/health`` is asked four times a second. Each evaluation must complete with a reason, nothing may be queued
again past the cap, the services' memory must stay under their limits, ``/health`` must keep answering, and the
other key must get the verdicts it gets alone. The figures are printed (docs/benchmarks.md records them).

No connection leaves the machine: the endpoint and the stack are on Docker networks the test makes.
"""

import json
import secrets
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from gateway.client import GatewayClient
from tests.fixtures import compose_stack

pytestmark = [pytest.mark.abuse, pytest.mark.compose, pytest.mark.docker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
STACK = "pbe-abuse"
ADMIN_KEY = "pbe-abuse-admin-" + secrets.token_urlsafe(16)
HOSTILE = "hostile"
IMAGE = "pybench-eval/app:latest"
ENDPOINT_SCRIPT = "/hostile/hostile_endpoint.py"
TASK = 30
"""A task whose recorded trajectory passes; the hostile evaluations run it with the hostile endpoint's answers."""
OTHER_TASKS = [30, 44, 77]
"""The other key's tasks: replayed, each passes alone (tests/test_compose_e2e.py)."""
MEMORY_LIMIT = 2**30
"""The gateway's and an executor's memory limit on Kubernetes (k8s/base): 1 GiB."""
MAX_ATTEMPTS = 3
STREAMS = 20
"""Event streams one key may hold (PBE_MAX_STREAMS_PER_KEY's default)."""
MODEL_DEADLINE_S = 10
"""Seconds one model request may take in all, in this stack (PBE_MODEL_DEADLINE_S; 600 by default)."""


@pytest.fixture(scope="module")
def stack(suite_path: Path) -> Iterator[str]:
    """The stack, with the hostile endpoint on its model network as ``hostile``."""
    variables = {
        "PBE_EXECUTORS": "1",
        "PBE_WARM_POOL_SIZE": "1",
        "PBE_GRADERS": "1",
        "PBE_EGRESS_ALLOWLIST": f"replay,{HOSTILE}",
        "PBE_MODEL_DEADLINE_S": str(MODEL_DEADLINE_S),
    }
    engine = docker.from_env()
    with compose_stack(STACK, suite_path, ADMIN_KEY, **variables) as url:
        endpoint = engine.containers.run(
            IMAGE,
            ["python3", ENDPOINT_SCRIPT, "--port", "8000"],
            name=f"{STACK}-{HOSTILE}",
            detach=True,
            network=f"{STACK}-models",
            volumes={
                str(ROOT / "tests" / "hostile_endpoint.py"): {"bind": "/hostile/hostile_endpoint.py", "mode": "ro"}
            },
            read_only=True,
            cap_drop=["ALL"],
            mem_limit="512m",
        )
        try:
            engine.networks.get(f"{STACK}-models").disconnect(endpoint)
            engine.networks.get(f"{STACK}-models").connect(endpoint, aliases=[HOSTILE])
            _wait_for_endpoint(endpoint)
            yield url
        finally:
            endpoint.remove(force=True)


def _wait_for_endpoint(container: Any) -> None:
    probe = "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)"
    deadline = time.monotonic() + 60
    while container.exec_run(["python3", "-c", probe]).exit_code != 0:
        assert time.monotonic() < deadline, container.logs().decode()[-2000:]
        time.sleep(0.5)


@dataclass
class HealthWatch:
    """``/health`` asked every 0.25 s from a thread: each answer's status and seconds."""

    url: str
    answers: list[tuple[int, float]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self.stop.wait(0.25):
                started = time.monotonic()
                try:
                    status = client.get(f"{self.url}/health").status_code
                except httpx.HTTPError:
                    status = 0
                self.answers.append((status, time.monotonic() - started))


def _new_key(name: str) -> str:
    made = subprocess.run(
        ["docker", "compose", "-p", STACK, "exec", "-T", "gateway", "python3", "-m", "gateway.keys", "create",
         "--name", name],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


def _peak_memory(service: str) -> int:
    """The most memory any container of ``service`` used since it started (cgroup v1's max_usage)."""
    engine = docker.from_env()
    containers = engine.containers.list(
        filters={"label": [f"com.docker.compose.project={STACK}", f"com.docker.compose.service={service}"]}
    )
    assert containers, service
    peaks = [c.stats(stream=False)["memory_stats"].get("max_usage", c.stats(stream=False)["memory_stats"]["usage"])
             for c in containers]  # fmt: skip
    return max(peaks)


def _submit(client: GatewayClient, model: str, **fields: Any) -> str:
    body = {
        "model": {"base_url": f"http://{HOSTILE}:8000/v1", "model": model},
        "tasks": [TASK],
        "prompt": "gpt",
        "preflight": False,
        "max_turns": 6,
        "cell_timeout_s": 60,
        **fields,
    }
    return str(client.submit(body)["evaluation"]["id"])


def _probe_lines(trajectory: dict[str, Any]) -> list[str]:
    text = json.dumps(trajectory)
    return [line for line in text.replace("\\n", "\n").splitlines() if line.startswith("PROBE ")]


@pytest.fixture(scope="module")
def run(stack: str) -> Iterator[dict[str, Any]]:
    """Everything at once; then what happened."""
    health = HealthWatch(stack)
    watcher = threading.Thread(target=health.run, daemon=True)
    watcher.start()
    other_key = _new_key("other-team")
    with GatewayClient(stack, api_key=ADMIN_KEY) as admin, GatewayClient(stack, api_key=other_key) as other:
        started = time.monotonic()
        evaluations = {
            "huge": _submit(admin, "huge"),
            "drip": _submit(admin, "drip"),
            "nested": _submit(admin, "nested"),
            "badtool": _submit(admin, "badtool", mode="tools"),
            "code": _submit(admin, "code"),
            "badjudge": str(
                admin.submit(
                    {
                        "model": {"base_url": "http://replay:8000/v1", "model": "pybench-replay"},
                        "tasks": [TASK],
                        "prompt": "gpt",
                        "preflight": False,
                        "judge": {"endpoint": {"base_url": f"http://{HOSTILE}:8000/v1", "model": "badjudge"}},
                    }
                )["evaluation"]["id"]
            ),
        }
        replayed = other.submit(
            {
                "model": {"base_url": "http://replay:8000/v1", "model": "pybench-replay"},
                "tasks": OTHER_TASKS,
                "prompt": "gpt",
                "preflight": False,
            }
        )["evaluation"]["id"]
        # The admin key holds its 20 streams on the code evaluation; the 21st is refused.
        streamer = httpx.Client(base_url=stack, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30)
        path = f"/v1/evaluations/{evaluations['code']}/events"
        held = [streamer.send(streamer.build_request("GET", path), stream=True) for _ in range(STREAMS)]
        refused = streamer.get(path)
        try:
            finals = {name: admin.wait(evaluation_id, timeout_s=900) for name, evaluation_id in evaluations.items()}
            finals["other"] = other.wait(replayed, timeout_s=900)
        finally:
            for response in held:
                response.close()
            streamer.close()
        wall_s = time.monotonic() - started
        health.stop.set()
        watcher.join(timeout=10)
        results = {name: admin.results(evaluation_id) for name, evaluation_id in evaluations.items()}
        results["other"] = other.results(replayed)
        trajectories = {
            name: admin.trajectory(evaluations[name], TASK) for name in ("code", "huge", "nested", "badtool", "drip")
        }
        files = admin.files(evaluations["code"], TASK)
        yield {
            "finals": finals,
            "results": results,
            "trajectories": trajectories,
            "files": files,
            "held": [r.status_code for r in held],
            "refused": refused,
            "health": health.answers,
            "wall_s": wall_s,
            "memory": {"gateway": _peak_memory("gateway"), "executor": _peak_memory("executor")},
        }


def _verdict(run: dict[str, Any], name: str, task: int = TASK) -> dict[str, Any]:
    (verdict,) = [v for v in run["results"][name]["verdicts"] if v["task_index"] == task]
    return dict(verdict)


def test_every_evaluation_completes_with_a_reason_and_nothing_is_queued_again_past_the_cap(
    run: dict[str, Any],
) -> None:
    for name, final in run["finals"].items():
        assert final["status"] == "completed", (name, final)
        for verdict in run["results"][name]["verdicts"]:
            assert verdict["attempt"] <= MAX_ATTEMPTS, (name, verdict)
            assert verdict["status"] in ("passed", "failed", "infra_error"), (name, verdict)
            if verdict["status"] != "passed":
                assert verdict["reason"], (name, verdict)


def test_a_huge_a_nested_and_a_dripping_answer_each_end_the_session_naming_what_happened(run: dict[str, Any]) -> None:
    huge, nested, drip = (_verdict(run, name) for name in ("huge", "nested", "drip"))
    for verdict in (huge, nested, drip):
        assert verdict["status"] == "infra_error", verdict
    assert "larger than 8,388,608 bytes" in huge["reason"] and "PBE_MODEL_MAX_REPLY_BYTES" in huge["reason"], huge
    assert "chat completion" in nested["reason"], nested["reason"]
    assert f"longer than {MODEL_DEADLINE_S} s in all" in drip["reason"] and "PBE_MODEL_DEADLINE_S" in drip["reason"], (
        drip
    )


def test_malformed_tool_calls_are_answered_and_the_session_goes_on(run: dict[str, Any]) -> None:
    trajectory = run["trajectories"]["badtool"]
    assert trajectory["end_reason"] not in ("crashed",), trajectory["end_reason"]
    assert len(trajectory["turns"]) >= 2, "the session went on after the malformed calls"


def test_hostile_cells_are_contained(run: dict[str, Any]) -> None:
    trajectory = run["trajectories"]["code"]
    assert trajectory["end_reason"] not in ("crashed", "sandbox_error"), (trajectory["end_reason"], trajectory["error"])
    text = json.dumps(trajectory)
    assert "sent the odd messages" in text and "wrote the files" in text
    probes = _probe_lines(trajectory)
    assert probes, "the socket cell reported its probes"
    assert not [line for line in probes if line.endswith("connected")], probes
    assert len(run["files"]) <= 1000, "output collection keeps at most 1,000 entries"
    assert "./output/sparse.bin" not in run["files"], "a sparse 100 GiB file is refused, not stored"


def test_a_judge_that_answers_badly_is_unparseable_not_a_crash(run: dict[str, Any]) -> None:
    judgment = _verdict(run, "badjudge")["judgment"]
    assert judgment is not None and judgment["status"] in ("unparseable", "error"), judgment


def test_another_keys_evaluation_gets_the_verdicts_it_gets_alone(run: dict[str, Any]) -> None:
    verdicts = {v["task_index"]: v["status"] for v in run["results"]["other"]["verdicts"]}
    assert verdicts == dict.fromkeys(OTHER_TASKS, "passed")


def test_the_service_stays_responsive_and_within_its_memory(run: dict[str, Any]) -> None:
    answers = run["health"]
    seconds = sorted(s for _, s in answers)
    figures = {
        "wall_s": round(run["wall_s"], 1),
        "health_requests": len(answers),
        "health_p50_ms": round(1000 * statistics.median(seconds), 1),
        "health_p95_ms": round(1000 * seconds[int(0.95 * (len(seconds) - 1))], 1),
        "health_max_ms": round(1000 * seconds[-1], 1),
        "gateway_peak_mib": round(run["memory"]["gateway"] / 2**20),
        "executor_peak_mib": round(run["memory"]["executor"] / 2**20),
        "streams_held": run["held"].count(200),
        "stream_refused_status": run["refused"].status_code,
    }
    print("\nabuse suite figures:", json.dumps(figures))
    assert len(answers) > 20 and all(status == 200 for status, _ in answers), answers
    assert figures["health_p95_ms"] < 1000, figures
    assert figures["health_max_ms"] < 5000, figures
    assert run["memory"]["gateway"] < MEMORY_LIMIT and run["memory"]["executor"] < MEMORY_LIMIT, figures
    assert run["held"] == [200] * STREAMS
    assert run["refused"].status_code == 429 and int(run["refused"].headers["retry-after"]) >= 1
