"""Helpers shared by several test modules: a gateway's settings and a valid submission, and the project's
sandbox objects on the Docker engine, and the compose stack under a project name of a test's own."""

import contextlib
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

from gateway.settings import GatewaySettings
from services.sandbox.contract import PROJECT, PROJECT_LABEL, ROLE_LABEL, RUNTIME_ROLES
from services.secretbox import SecretBox

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


def test_secrets() -> SecretBox:
    """The box of the tests' ``PBE_SECRETS_KEY`` (conftest sets one for the whole run): what the services'
    settings make, so a key the tests hold is one the gateway and workers they start can open."""
    return SecretBox.from_setting(os.environ["PBE_SECRETS_KEY"])


test_secrets.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test
