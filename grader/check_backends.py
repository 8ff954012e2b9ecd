"""Where grading sandboxes run, by the grader's ``PBE_GRADING_BACKEND``: a container on Docker
(``grader.check_sandbox``) or a pod on Kubernetes (``grader.check_pods``). Each imports its SDK only when chosen."""

import functools
from typing import Any, Protocol

from grader.settings import GraderSettings
from services.verdict import CheckResult


class FileCheckBackend(Protocol):
    """``run_file_checks`` of either backend: the checks, the files, the image and the time the checks may take."""

    def __call__(
        self, checks: list[dict[str, Any]], files: dict[str, bytes], *, image: str, timeout_s: float
    ) -> list[CheckResult]: ...


def file_check_backend(settings: GraderSettings | None = None) -> FileCheckBackend:
    """The ``run_file_checks`` of the backend ``settings`` name (default: read from the environment now)."""
    settings = settings or GraderSettings()
    if settings.GRADING_BACKEND == "kubernetes":
        from grader import check_pods

        runner: FileCheckBackend = functools.partial(
            check_pods.run_file_checks,
            namespace=settings.K8S_NAMESPACE,
            runtime_class=settings.K8S_RUNTIME_CLASS or None,
        )
        return runner
    from grader import check_sandbox

    docker_runner: FileCheckBackend = functools.partial(
        check_sandbox.run_file_checks, runtime_volume=settings.SANDBOX_RUNTIME_VOLUME
    )
    return docker_runner


def reap_grading_sandboxes(older_than_s: float, settings: GraderSettings | None = None) -> list[str]:
    """Remove the grading sandboxes (containers or pods, by ``PBE_GRADING_BACKEND``) a killed grader left, older
    than ``older_than_s``; returns their names."""
    settings = settings or GraderSettings()
    if settings.GRADING_BACKEND == "kubernetes":
        from grader import check_pods

        return check_pods.reap(older_than_s=older_than_s, namespace=settings.K8S_NAMESPACE)
    from grader import check_sandbox

    return check_sandbox.reap(older_than_s=older_than_s)
