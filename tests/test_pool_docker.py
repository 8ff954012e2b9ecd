"""The warm pool, with real sandbox containers: hand-out is immediate, never reused, and nothing is left.

Every pool here is started as a worker of this run's own (``WORKER``), and only sandboxes of that worker are
counted or removed: a stack running beside the tests (``make demo`` leaves one up) keeps its warm pool.
"""

import uuid
from collections.abc import Iterator

import docker
import pytest

from executor.pool import POOL_EVALUATION, WarmPool
from services.sandbox.base import SandboxSpec
from services.sandbox.contract import DEFAULT_SANDBOX_IMAGE, EVALUATION_LABEL, WORKER_LABEL
from services.sandbox.docker import BACKGROUND_CPU_SHARES, SESSION_CPU_SHARES, DockerSandboxBackend

pytestmark = [pytest.mark.docker, pytest.mark.slow]

IMAGE = DEFAULT_SANDBOX_IMAGE
EVALUATION = "test-pool"
WORKER = f"pool-test-{uuid.uuid4().hex[:8]}"
"""The worker this run's pools start as: its label tells their sandboxes from any other executor's."""


@pytest.fixture()
def backend(sandbox_network: str) -> Iterator[DockerSandboxBackend]:
    backend = DockerSandboxBackend(network=sandbox_network)
    yield backend
    backend.reap(evaluation_id=EVALUATION)
    backend.reap(worker=WORKER)


def _pool_containers(worker: str = WORKER) -> list[object]:
    """The warm sandboxes of this run's pools (of ``worker``), never another executor's."""
    labels = [f"{EVALUATION_LABEL}={POOL_EVALUATION}", f"{WORKER_LABEL}={worker}"]
    return list(docker.from_env().containers.list(all=True, filters={"label": labels}))


def test_a_warm_sandbox_is_handed_out_once_with_libraries_imported(backend: DockerSandboxBackend) -> None:
    # PBE_WARM_IMPORTS=numpy,pandas (the default imports nothing ahead).
    pool = WarmPool(backend, SandboxSpec(EVALUATION, 0, 0, image=IMAGE, worker=WORKER), imports=("numpy", "pandas"))
    try:
        assert pool.wait_ready(120), pool.last_error
        first = pool.take(SandboxSpec(EVALUATION, 1, 1, image=IMAGE, worker=WORKER))
        assert first.warm
        # The warm imports are loaded, matplotlib is left to the cells that use it, and the model's namespace holds
        # none of them.
        execution, output = first.kernel.execute(
            "import sys\nprint('pandas' in sys.modules, 'matplotlib.pyplot' in sys.modules, 'pandas' in dir(), "
            "'np' in dir())",
            timeout_s=30,
        )
        assert execution.ok and output.items[0].text == "True False False False\n"
        assert pool.wait_ready(120), pool.last_error
        second = pool.take(SandboxSpec(EVALUATION, 2, 1, image=IMAGE, worker=WORKER))
        assert second.warm and second.handle.sandbox_id != first.handle.sandbox_id
        for sandbox in (first, second):
            sandbox.kernel.close()
            backend.stop(sandbox.handle)
    finally:
        pool.close()
    assert _pool_containers() == []


def test_a_warm_sandbox_yields_the_cpu_until_a_session_takes_it(backend: DockerSandboxBackend) -> None:
    engine = docker.from_env()
    pool = WarmPool(backend, SandboxSpec(EVALUATION, 0, 0, image=IMAGE, worker=WORKER), imports=())
    try:
        assert pool.wait_ready(120), pool.last_error
        (waiting,) = _pool_containers()
        assert waiting.attrs["HostConfig"]["CpuShares"] == BACKGROUND_CPU_SHARES  # type: ignore[attr-defined]
        taken = pool.take(SandboxSpec(EVALUATION, 1, 1, image=IMAGE, worker=WORKER))
        assert taken.warm and taken.handle.sandbox_id == waiting.id  # type: ignore[attr-defined]
        shares = engine.containers.get(taken.handle.sandbox_id).attrs["HostConfig"]["CpuShares"]
        assert shares == SESSION_CPU_SHARES
        # A sandbox started for a session (other limits: not the pool's) has a session's share from its start.
        own = pool.take(SandboxSpec(EVALUATION, 2, 1, image=IMAGE, memory_mb=1024, worker=WORKER))
        assert not own.warm
        assert engine.containers.get(own.handle.sandbox_id).attrs["HostConfig"]["CpuShares"] == SESSION_CPU_SHARES
        for sandbox in (taken, own):
            sandbox.kernel.close()
            backend.stop(sandbox.handle)
    finally:
        pool.close()
        engine.close()
    assert _pool_containers() == []


def test_a_spec_with_other_limits_gets_a_sandbox_started_on_demand(backend: DockerSandboxBackend) -> None:
    pool = WarmPool(backend, SandboxSpec(EVALUATION, 0, 0, image=IMAGE, worker=WORKER), imports=())
    try:
        sandbox = pool.take(SandboxSpec(EVALUATION, 1, 1, image=IMAGE, memory_mb=1024, worker=WORKER))
        assert not sandbox.warm
        container = docker.from_env().containers.get(sandbox.handle.sandbox_id)
        assert container.labels[EVALUATION_LABEL] == EVALUATION
        assert container.attrs["HostConfig"]["Memory"] == 1024 * 2**20
        sandbox.kernel.close()
        backend.stop(sandbox.handle)
    finally:
        pool.close()
    assert _pool_containers() == []


def test_a_warm_sandbox_that_died_is_replaced(backend: DockerSandboxBackend) -> None:
    pool = WarmPool(backend, SandboxSpec(EVALUATION, 0, 0, image=IMAGE, worker=WORKER), imports=())
    try:
        assert pool.wait_ready(120), pool.last_error
        (container,) = _pool_containers()
        container.kill()  # type: ignore[attr-defined]
        sandbox = pool.take(SandboxSpec(EVALUATION, 1, 1, image=IMAGE, worker=WORKER))
        # never the dead one: the pool discards it and hands out its next start (it waits for the pool's start
        # rather than starting one of its own beside it)
        assert sandbox.handle.sandbox_id != container.id  # type: ignore[attr-defined]
        execution, _ = sandbox.kernel.execute("1", timeout_s=30)
        assert execution.ok
        sandbox.kernel.close()
        backend.stop(sandbox.handle)
    finally:
        pool.close()
    assert _pool_containers() == []


def test_a_pool_of_two_keeps_two_ready_labelled_with_its_worker_and_the_next_life_sweeps_them(
    backend: DockerSandboxBackend,
) -> None:
    from executor.worker import _sweep

    spec = SandboxSpec(EVALUATION, 0, 0, image=IMAGE, worker="pool-test-worker")
    pool = WarmPool(backend, spec, size=2, starts=2, imports=())
    try:
        assert pool.wait_ready(180, count=2), pool.last_error
        containers = _pool_containers("pool-test-worker")
        assert len(containers) == 2
        assert {c.labels[WORKER_LABEL] for c in containers} == {"pool-test-worker"}  # type: ignore[attr-defined]
        taken = pool.take(SandboxSpec(EVALUATION, 1, 1, image=IMAGE, worker="pool-test-worker"))
        assert taken.warm and taken.handle.sandbox_id in {c.id for c in containers}  # type: ignore[attr-defined]
        taken.kernel.close()  # the session's sandbox is "left behind", as by a worker killed outright
    finally:
        pool._closed = True  # a killed worker closes nothing: its pool's sandboxes stay behind too
    other = backend.start(SandboxSpec(EVALUATION, 3, 1, image=IMAGE, worker="another-worker"))
    try:
        _sweep(backend, "pool-test-worker")  # what the same worker does first when it starts again
        left = docker.from_env().containers.list(all=True, filters={"label": f"{WORKER_LABEL}=pool-test-worker"})
        assert left == [], "the previous life's sandboxes are still there"
        assert docker.from_env().containers.get(other.sandbox_id).status == "running"  # not another worker's
    finally:
        backend.stop(other)


def test_a_pool_that_cannot_start_sandboxes_fails_a_take_at_once(backend: DockerSandboxBackend) -> None:
    import time

    from services.errors import SandboxStartError

    missing = "pybench-eval/no-such-image:latest"
    pool = WarmPool(backend, SandboxSpec(EVALUATION, 0, 0, image=missing, worker=WORKER), size=2, imports=())
    try:
        pool.fill()
        started = time.monotonic()
        with pytest.raises(SandboxStartError, match="make images"):
            pool.take(SandboxSpec(EVALUATION, 1, 1, image=missing, worker=WORKER))
        assert time.monotonic() - started < 10, "the take waited for a pool that cannot start anything"
        assert pool.last_error is not None and "make images" in pool.last_error
    finally:
        pool.close()
