"""Shared fixtures: the suite's path, and a real Redis server on a free loopback port for the session."""

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from services.live.secretbox import SecretBox, new_key
from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent

os.environ.setdefault("PBE_SECRETS_KEY", new_key())
"""Every settings object the tests make (and every worker they start) seals API keys under this one key, as the
services of one stack share theirs."""


@pytest.fixture(scope="session")
def secret_box() -> SecretBox:
    """The box of the tests' ``PBE_SECRETS_KEY``: what the services' settings make."""
    return SecretBox.from_setting(os.environ["PBE_SECRETS_KEY"])


@pytest.fixture(scope="session")
def suite_path() -> Path:
    """The PyBench suite: ``PBE_SUITE_PATH``, else ``../shared/pybench`` beside the repository."""
    path = Path(os.environ.get("PBE_SUITE_PATH", ROOT.parent / "shared" / "pybench")).resolve()
    if not (path / "data" / "meta" / "task.json").is_file():
        pytest.fail(f"no PyBench suite at {path}: set PBE_SUITE_PATH")
    return path


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server (Debian's package) on 127.0.0.1, persistence off, stopped after the session."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is missing: apt-get install redis-server (the tests use a real Redis)")
    server = RedisServer(tmp_path_factory.mktemp("redis"), persistent=False)
    server.start()
    yield server.url
    server.stop()


@pytest.fixture()
def redis_client(redis_url: str) -> Iterator[Redis]:
    """A client of the session's Redis, flushed before each test."""
    client = Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture(scope="session")
def sandbox_network() -> Iterator[str]:
    """The name of an internal network for the tests' sandboxes; removed, with any sandbox left on it, at the end."""
    import docker

    from services.sandbox.contract import ROLE_LABEL, SANDBOX_ROLE

    name = "pbe-test-sandboxes"
    yield name
    engine = docker.from_env()
    for container in engine.containers.list(
        all=True, filters={"label": f"{ROLE_LABEL}={SANDBOX_ROLE}"}, ignore_removed=True
    ):
        if name in container.attrs["NetworkSettings"]["Networks"]:
            container.remove(force=True)
    for network in engine.networks.list(names=[name]):
        network.remove()
