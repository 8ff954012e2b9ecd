"""``make bench-throughput``'s CPU ledger: a sandbox's busy time is charged to the sandboxes, not to the stack, and
nothing is charged twice (the components add up to the machine's busy time). A real container that computes."""

import os

import docker.client
import pytest

from scripts.bench_throughput import CGROUP, CpuLedger

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(
        not (CGROUP / "cpuacct" / "docker").is_dir() or os.geteuid() != 0,
        reason="reads the engine's cgroup v1 CPU accounting, as root (the benchmark's machine)",
    ),
]

IMAGE = "pybench-eval/sandbox:latest"


BUSY = "import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end: pass"
"""One CPU-second of work."""


def test_a_busy_container_is_charged_to_the_sandboxes_after_it_is_gone() -> None:
    engine = docker.client.from_env()
    ledger = CpuLedger(stack=set())
    container = engine.containers.run(IMAGE, entrypoint=["python3", "-c", BUSY], detach=True, network_mode="none")
    try:
        assert container.wait(timeout=60)["StatusCode"] == 0
    finally:
        container.remove(force=True)
        engine.close()
    spent = ledger.components()  # never sampled while it ran: the engine's cgroup kept its time
    assert 0.9 <= spent["sandboxes"] <= 3.0, spent
    assert spent["stack"] == 0.0
    assert set(spent) == {"sandboxes", "stack", "fuse-overlayfs", "engine", "other"}
    machine_share = sum(spent.values())
    assert machine_share >= spent["sandboxes"]  # "other" is the machine less the rest: never negative by much
    assert spent["other"] > -0.5, spent


def test_the_stacks_own_containers_are_charged_to_the_stack() -> None:
    engine = docker.client.from_env()
    container = engine.containers.run(IMAGE, entrypoint=["sleep", "30"], detach=True, network_mode="none")
    try:
        ledger = CpuLedger(stack={container.id})
        container.exec_run(["python3", "-c", BUSY])
        spent = ledger.components()
    finally:
        container.remove(force=True)
        engine.close()
    assert 0.9 <= spent["stack"] <= 3.0 and spent["sandboxes"] < 0.5, spent
