"""The warm pool, with real sandbox containers: hand-out is immediate, never reused, and nothing is left."""

from collections.abc import Iterator

import docker
import pytest

from executor.pool import POOL_EVALUATION, WarmPool
from executor.sandboxes.base import SandboxSpec
from executor.sandboxes.docker import DockerSandboxBackend
from services.sandbox import DEFAULT_SANDBOX_IMAGE, EVALUATION_LABEL

pytestmark = [pytest.mark.docker, pytest.mark.slow]

IMAGE = DEFAULT_SANDBOX_IMAGE
EVALUATION = "test-pool"


@pytest.fixture()
def backend(sandbox_network: str) -> Iterator[DockerSandboxBackend]:
    backend = DockerSandboxBackend(network=sandbox_network)
    yield backend
    backend.reap(evaluation_id=EVALUATION)
    backend.reap(evaluation_id=POOL_EVALUATION)


def _pool_containers() -> list[object]:
    label = f"{EVALUATION_LABEL}={POOL_EVALUATION}"
    return list(docker.from_env().containers.list(all=True, filters={"label": label}))


def test_a_warm_sandbox_is_handed_out_once_with_libraries_imported(backend: DockerSandboxBackend) -> None:
    pool = WarmPool(backend, SandboxSpec(EVALUATION, 0, 0, image=IMAGE))
    try:
        assert pool.wait_ready(120), pool.last_error
        first = pool.take(SandboxSpec(EVALUATION, 1, 1, image=IMAGE))
        assert first.warm
        execution, output = first.kernel.execute(
            "import sys\nprint('pandas' in sys.modules, 'pandas' in dir(), 'np' in dir())", timeout_s=30
        )
        assert execution.ok and output.items[0].text == "True False False\n"
        assert pool.wait_ready(120), pool.last_error
        second = pool.take(SandboxSpec(EVALUATION, 2, 1, image=IMAGE))
        assert second.warm and second.handle.sandbox_id != first.handle.sandbox_id
        for sandbox in (first, second):
            sandbox.kernel.close()
            backend.stop(sandbox.handle)
    finally:
        pool.close()
    assert _pool_containers() == []


def test_a_spec_with_other_limits_gets_a_sandbox_started_on_demand(backend: DockerSandboxBackend) -> None:
    pool = WarmPool(backend, SandboxSpec(EVALUATION, 0, 0, image=IMAGE), prewarm=False)
    try:
        sandbox = pool.take(SandboxSpec(EVALUATION, 1, 1, image=IMAGE, memory_mb=1024))
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
    pool = WarmPool(backend, SandboxSpec(EVALUATION, 0, 0, image=IMAGE), prewarm=False)
    try:
        assert pool.wait_ready(120), pool.last_error
        (container,) = _pool_containers()
        container.kill()  # type: ignore[attr-defined]
        sandbox = pool.take(SandboxSpec(EVALUATION, 1, 1, image=IMAGE))
        assert not sandbox.warm
        execution, _ = sandbox.kernel.execute("1", timeout_s=30)
        assert execution.ok
        sandbox.kernel.close()
        backend.stop(sandbox.handle)
    finally:
        pool.close()
    assert _pool_containers() == []
