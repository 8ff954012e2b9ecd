"""First contact: the set-up the two README commands do on their own, and the compose profiles of a real model.

``scripts/host-deps.sh`` runs for real (as an unprivileged user, so that it must name what is missing rather
than install it); the compose file is rendered by Compose itself (``docker compose config``).
"""

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _as_nobody(*args: str, path: str = "/usr/bin:/bin") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "bash", str(ROOT / "scripts/host-deps.sh"),
         *args],
        env={"PATH": path, "PYTHON": shutil.which("python3") or "python3"},
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to the user nobody needs root")
def test_a_user_without_rights_is_told_in_one_message_what_to_install() -> None:
    done = _as_nobody("debootstrap", "pbe-no-such-tool", "bash")
    assert done.returncode == 1 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert "needs debootstrap pbe-no-such-tool" in line
    assert "sudo apt-get install -y debootstrap pbe-no-such-tool" in line and "bash" not in line.split("needs")[1]


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to the user nobody needs root")
def test_nothing_missing_passes_silently_and_an_engine_out_of_reach_is_named() -> None:
    assert _as_nobody("bash", "setpriv").returncode == 0
    refused = _as_nobody("docker")  # nobody may not use the engine's socket
    assert refused.returncode == 1 and "the Docker engine does not answer" in refused.stderr


def _compose_config(*profiles: str) -> dict[str, Any]:
    if shutil.which("docker") is None:
        pytest.skip("no docker command")
    flags = [arg for profile in profiles for arg in ("--profile", profile)]
    done = subprocess.run(
        ["docker", "compose", "-p", "pbe-config-test", *flags, "config", "--format", "json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PBE_REDIS_PASSWORD": "config-test-password"},  # the stack's required secrets
    )
    if "is not a docker command" in done.stderr:
        pytest.skip("Compose v2 is missing: make compose-plugin")
    assert done.returncode == 0, done.stderr
    config: dict[str, Any] = json.loads(done.stdout)
    return config


def test_the_model_profiles_render_and_stay_off_by_default() -> None:
    assert not {"model", "vllm"} & set(_compose_config()["services"])
    services = _compose_config("smollm2", "vllm")["services"]
    model = services["model"]
    assert model["image"] == "pybench-eval/llama:latest" and "ports" not in model
    assert model["read_only"] is True and model["cap_drop"] == ["ALL"]
    assert "smollm2" in model["command"] and any(v["target"] == "/models" and v["read_only"] for v in model["volumes"])
    vllm = services["vllm"]
    (device,) = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"] and "ports" not in vllm
    allowed = services["executor"]["environment"]["PBE_EGRESS_ALLOWLIST"].split(",")
    assert {"model", "vllm", "replay"} <= set(allowed)


def test_workers_serve_metrics_and_stop_gracefully_in_compose() -> None:
    services = _compose_config()["services"]
    for name in ("executor", "grader"):
        assert services[name]["environment"]["PBE_METRICS_PORT"] == "9100"
    # A session's turn, and a grading (checks and judge, up to 120 s), finish before the container is killed.
    assert (services["executor"]["stop_grace_period"], services["grader"]["stop_grace_period"]) == ("2m0s", "2m30s")
