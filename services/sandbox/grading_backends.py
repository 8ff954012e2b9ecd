"""Where grading sandboxes run, by the grader's ``PBE_GRADING_BACKEND``: a container on Docker
(``services.sandbox.grading`` through the ``DockerSandboxBackend``) or a pod on Kubernetes
(``services.sandbox.grading_pods``). Each imports its SDK only when chosen."""

import functools
from collections.abc import Mapping
from typing import Any, Protocol

from services.sandbox.base import SandboxBackend
from services.sandbox.contract import RuntimeVolumeMode
from services.verdict import CheckResult


class FileCheckBackend(Protocol):
    """``run_file_checks`` of either backend: the checks, the files, the image and the time the checks may take."""

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


def file_check_backend(settings: GradingBackendSettings, checker: Mapping[str, bytes]) -> FileCheckBackend:
    """The ``run_file_checks`` of the backend ``settings`` name, running ``checker`` (the checker's scripts)."""
    if settings.GRADING_BACKEND == "kubernetes":
        from services.sandbox import grading_pods

        runner: FileCheckBackend = functools.partial(
            grading_pods.run_file_checks,
            checker=checker,
            namespace=settings.K8S_NAMESPACE,
            runtime_class=settings.K8S_RUNTIME_CLASS or None,
        )
        return runner
    from services.sandbox import grading_docker

    docker_runner: FileCheckBackend = functools.partial(
        grading_docker.run_file_checks, checker=checker, runtime_volume=settings.SANDBOX_RUNTIME_VOLUME
    )
    return docker_runner


def reap_grading_sandboxes(older_than_s: float, settings: GradingBackendSettings) -> list[str]:
    """Remove the grading sandboxes (containers or pods, by ``PBE_GRADING_BACKEND``) a killed grader left, older
    than ``older_than_s``, with the backend's own ``reap``; returns their names."""
    backend: SandboxBackend
    if settings.GRADING_BACKEND == "kubernetes":
        from services.sandbox.kubernetes import KubernetesSandboxBackend

        backend = KubernetesSandboxBackend(namespace=settings.K8S_NAMESPACE)
    else:
        from services.sandbox.docker import DockerSandboxBackend

        backend = DockerSandboxBackend(runtime_volume=settings.SANDBOX_RUNTIME_VOLUME)
    return backend.reap(older_than_s=older_than_s, purpose="grading")
