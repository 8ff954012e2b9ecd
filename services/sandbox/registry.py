"""Sandbox backends by name."""

from collections.abc import Callable
from typing import Protocol

from services.errors import ConfigurationError
from services.sandbox.base import SandboxBackend
from services.sandbox.contract import RuntimeVolumeMode


class BackendSettings(Protocol):
    """What a backend's construction reads of a service's settings (the executor's ``ExecutorSettings``)."""

    @property
    def SANDBOX_BACKEND(self) -> str: ...

    @property
    def SANDBOX_NETWORK(self) -> str: ...

    @property
    def SANDBOX_RUNTIME_VOLUME(self) -> RuntimeVolumeMode: ...

    @property
    def SANDBOX_LOCAL_ROOT(self) -> str | None: ...

    @property
    def K8S_NAMESPACE(self) -> str: ...

    @property
    def K8S_RUNTIME_CLASS(self) -> str: ...


def _docker(settings: BackendSettings) -> SandboxBackend:
    from services.sandbox.docker import DockerSandboxBackend

    return DockerSandboxBackend(network=settings.SANDBOX_NETWORK, runtime_volume=settings.SANDBOX_RUNTIME_VOLUME)


def _local(settings: BackendSettings) -> SandboxBackend:
    from services.sandbox.local import LocalSandboxBackend

    return LocalSandboxBackend(root=settings.SANDBOX_LOCAL_ROOT)


def _kubernetes(settings: BackendSettings) -> SandboxBackend:
    from services.sandbox.kubernetes import KubernetesSandboxBackend

    return KubernetesSandboxBackend(namespace=settings.K8S_NAMESPACE, runtime_class=settings.K8S_RUNTIME_CLASS)


BACKENDS: dict[str, Callable[[BackendSettings], SandboxBackend]] = {
    "docker": _docker,
    "kubernetes": _kubernetes,
    "local": _local,
}
"""Backend factories by name; each imports its SDK only when called."""


def get_backend(settings: BackendSettings) -> SandboxBackend:
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
