"""Sandbox backends by name: the one place a backend is built from a service's settings."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from services.errors import ConfigurationError
from services.sandbox.base import SandboxBackend
from services.sandbox.contract import RuntimeVolumeMode
from services.sandbox.k8s_pods import DEFAULT_NAMESPACE


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


@dataclass(frozen=True)
class BackendOptions:
    """What constructing any backend may need; each backend reads its own (the settings' ``PBE_SANDBOX_*`` and
    ``PBE_K8S_*``)."""

    network: str = ""
    runtime_volume: RuntimeVolumeMode = "auto"
    local_root: str | None = None
    k8s_namespace: str = ""
    k8s_runtime_class: str = ""


def _docker(options: BackendOptions) -> SandboxBackend:
    from services.sandbox.docker import DockerSandboxBackend

    return DockerSandboxBackend(network=options.network, runtime_volume=options.runtime_volume)


def _local(options: BackendOptions) -> SandboxBackend:
    from services.sandbox.local import LocalSandboxBackend

    return LocalSandboxBackend(root=options.local_root)


def _kubernetes(options: BackendOptions) -> SandboxBackend:
    from services.sandbox.kubernetes import KubernetesSandboxBackend

    return KubernetesSandboxBackend(options.k8s_namespace or DEFAULT_NAMESPACE, options.k8s_runtime_class or None)


BACKENDS: dict[str, Callable[[BackendOptions], SandboxBackend]] = {
    "docker": _docker,
    "kubernetes": _kubernetes,
    "local": _local,
}
"""Backend factories by name; each imports its SDK only when called."""


def make_backend(name: str, options: BackendOptions) -> SandboxBackend:
    """A new backend of the kind ``name`` (docker, kubernetes, local) built with ``options``: the one place a
    backend is constructed from settings, for sessions (``get_backend``) and gradings
    (``services.sandbox.grading_backends``) alike.

    Raises:
        ConfigurationError: no backend has that name; the message lists the names there are.
    """
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise ConfigurationError(
            f"unknown sandbox backend {name!r}; set PBE_SANDBOX_BACKEND (or the grader's PBE_GRADING_BACKEND) to "
            f"one of: {', '.join(sorted(BACKENDS))}"
        ) from None
    return factory(options)


def get_backend(settings: BackendSettings) -> SandboxBackend:
    """A new session backend, the one ``PBE_SANDBOX_BACKEND`` names (``make_backend``).

    Raises:
        ConfigurationError: no backend has that name; the message lists the names there are.
    """
    options = BackendOptions(
        network=settings.SANDBOX_NETWORK,
        runtime_volume=settings.SANDBOX_RUNTIME_VOLUME,
        local_root=settings.SANDBOX_LOCAL_ROOT,
        k8s_namespace=settings.K8S_NAMESPACE,
        k8s_runtime_class=settings.K8S_RUNTIME_CLASS,
    )
    return make_backend(settings.SANDBOX_BACKEND, options)
