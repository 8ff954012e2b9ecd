"""Helpers shared by several test modules: a gateway's settings and a valid submission, and the project's
sandbox objects on the Docker engine."""

from pathlib import Path

from gateway.settings import GatewaySettings
from services.sandbox import PROJECT, PROJECT_LABEL

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
        found["volume", volume["Name"]] = dict(volume.get("Labels") or {})
    engine.close()
    return found
