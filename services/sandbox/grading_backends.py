"""Where grading sandboxes run, by the grader's ``PBE_GRADING_BACKEND``: the ``SandboxBackend`` it names (a
container on Docker, a pod on Kubernetes), built by the registry as every backend is and used the one way
``services.sandbox.grading`` uses any backend. Each backend imports its SDK only when chosen."""

import functools
from collections.abc import Mapping
from typing import Any, Protocol

from services.sandbox import grading
from services.sandbox.base import SandboxBackend
from services.sandbox.contract import RuntimeVolumeMode
from services.sandbox.registry import BackendOptions, make_backend
from services.verdict import CheckResult


class FileCheckBackend(Protocol):
    """``run_file_checks`` on the chosen backend: the checks, the files, the image and the time the checks may take."""

    def __call__(
        self, checks: list[dict[str, Any]], files: dict[str, bytes], *, image: str, timeout_s: float
    ) -> list[CheckResult]: ...


class GradingBackendSettings(Protocol):
    """What the choice of a grading backend reads of a service's settings (the grader's ``GraderSettings``)."""

    @property
    def GRADING_BACKEND(self) -> str: ...

    @property
    def K8S_NAMESPACE(self) -> str: ...

    @property
    def K8S_RUNTIME_CLASS(self) -> str: ...

    @property
    def SANDBOX_RUNTIME_VOLUME(self) -> RuntimeVolumeMode: ...


def grading_backend(settings: GradingBackendSettings) -> SandboxBackend:
    """The sandbox backend ``PBE_GRADING_BACKEND`` names for gradings (docker or kubernetes), built where every
    backend is (``services.sandbox.registry.make_backend``); a grading needs no sandbox network.

    Raises:
        ConfigurationError: no backend has that name.
    """
    options = BackendOptions(
        runtime_volume=settings.SANDBOX_RUNTIME_VOLUME,
        k8s_namespace=settings.K8S_NAMESPACE,
        k8s_runtime_class=settings.K8S_RUNTIME_CLASS,
    )
    return make_backend(settings.GRADING_BACKEND, options)


def file_check_backend(settings: GradingBackendSettings, checker: Mapping[str, bytes]) -> FileCheckBackend:
    """``grading.run_file_checks`` on the backend ``settings`` name, running ``checker`` (the checker's scripts)."""
    runner: FileCheckBackend = functools.partial(grading.run_file_checks, grading_backend(settings), checker=checker)
    return runner


def reap_grading_sandboxes(older_than_s: float, settings: GradingBackendSettings) -> list[str]:
    """Remove the grading sandboxes (containers or pods, by ``PBE_GRADING_BACKEND``) a killed grader left, older
    than ``older_than_s``, with the backend's own ``reap``; returns their names."""
    return grading_backend(settings).reap(older_than_s=older_than_s, purpose="grading")
