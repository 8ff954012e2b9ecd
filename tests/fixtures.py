"""Helpers shared by the tests that build a gateway in-process: its settings and a valid submission."""

from pathlib import Path

from gateway.settings import GatewaySettings

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
