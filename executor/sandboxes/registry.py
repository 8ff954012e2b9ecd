"""Sandbox backends by name."""

from collections.abc import Callable

from executor.sandboxes.base import SandboxBackend
from executor.settings import ExecutorSettings
from services.errors import ConfigurationError


def _docker(settings: ExecutorSettings) -> SandboxBackend:
    from executor.sandboxes.docker import DockerSandboxBackend

    return DockerSandboxBackend(network=settings.SANDBOX_NETWORK, runtime_volume=settings.SANDBOX_RUNTIME_VOLUME)


def _local(settings: ExecutorSettings) -> SandboxBackend:
    from executor.sandboxes.local import LocalSandboxBackend

    return LocalSandboxBackend(root=settings.SANDBOX_LOCAL_ROOT)


def _kubernetes(settings: ExecutorSettings) -> SandboxBackend:
    from executor.sandboxes.kubernetes import KubernetesSandboxBackend

    return KubernetesSandboxBackend(namespace=settings.K8S_NAMESPACE, runtime_class=settings.K8S_RUNTIME_CLASS)


BACKENDS: dict[str, Callable[[ExecutorSettings], SandboxBackend]] = {
    "docker": _docker,
    "kubernetes": _kubernetes,
    "local": _local,
}
"""Backend factories by name; each imports its SDK only when called."""


def get_backend(settings: ExecutorSettings) -> SandboxBackend:
    """Return a new backend instance.

    Raises:
        ConfigurationError: no backend has that name; the message lists the names there are.
    """
    name = settings.SANDBOX_BACKEND
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise ConfigurationError(
            f"unknown sandbox backend {name!r}; set PBE_SANDBOX_BACKEND to one of: {', '.join(sorted(BACKENDS))}"
        ) from None
    return factory(settings)
