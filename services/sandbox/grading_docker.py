"""Gradings on Docker: ``services.sandbox.grading`` through a ``DockerSandboxBackend`` (a container and its
workspace volume, both removed when the call returns; ``reap`` removes what a killed grader left behind)."""

from collections.abc import Mapping
from typing import Any

from services.sandbox import grading
from services.sandbox.contract import DEFAULT_SANDBOX_IMAGE, RuntimeVolumeMode
from services.sandbox.docker import DockerSandboxBackend
from services.verdict import CheckResult


def run_file_checks(
    checks: list[dict[str, Any]],
    files: dict[str, bytes],
    *,
    checker: Mapping[str, bytes],
    image: str = DEFAULT_SANDBOX_IMAGE,
    timeout_s: float = grading.DEFAULT_TIMEOUT_S,
    client: Any = None,
    runtime_volume: RuntimeVolumeMode = "auto",
) -> list[CheckResult]:
    """``grading.run_file_checks`` in a container of the engine ``client`` (default: from the environment),
    with the image's ``/opt/venv`` and ``/usr`` served as ``runtime_volume`` says
    (``services.sandbox.runtime_volumes``).

    Raises:
        SandboxStartError: the Docker engine cannot be reached, or the image is missing (``make images``).
    """
    backend = DockerSandboxBackend(client=client, runtime_volume=runtime_volume)
    return grading.run_file_checks(backend, checks, files, checker=checker, image=image, timeout_s=timeout_s)


def reap(older_than_s: float = 0.0, client: Any = None) -> list[str]:
    """Remove grading containers and volumes older than ``older_than_s``; returns their names.

    Raises:
        SandboxStartError: the Docker engine cannot be reached.
    """
    return DockerSandboxBackend(client=client).reap(older_than_s=older_than_s, purpose="grading")
