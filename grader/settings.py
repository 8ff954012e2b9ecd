"""The grader's settings (``PBE_`` environment variables), validated when a job starts."""

from typing import Literal

from services.sandbox.contract import DEFAULT_SANDBOX_IMAGE, RuntimeVolumeMode
from services.sandbox.k8s_pods import DEFAULT_NAMESPACE as DEFAULT_K8S_NAMESPACE
from services.settings import ServiceSettings


class GraderSettings(ServiceSettings):
    """What every service needs (Redis, the suite, the artifact store), and the grading sandbox."""

    SANDBOX_IMAGE: str = DEFAULT_SANDBOX_IMAGE
    """The image whose containers run the checks that open produced files (the sessions' own sandbox image)."""
    SANDBOX_RUNTIME_VOLUME: RuntimeVolumeMode = "auto"
    """Serve the image's ``/opt/venv`` and ``/usr`` to grading containers from read-only volumes: ``auto`` (where the
    engine's storage driver is FUSE), ``on`` or ``off`` (``services.sandbox.runtime_volumes``)."""
    GRADING_TIMEOUT_S: float = 120.0
    """How long the checks of one session may run in their sandbox before it is killed (they then fail)."""
    GRADING_BACKEND: Literal["docker", "kubernetes"] = "docker"
    """Where grading sandboxes run (``services.sandbox.grading`` on the backend it names): ``docker`` (a container)
    or ``kubernetes`` (a pod)."""
    K8S_NAMESPACE: str = DEFAULT_K8S_NAMESPACE
    """The namespace of the grading pods (the session sandboxes' namespace)."""
    K8S_RUNTIME_CLASS: str = ""
    """A RuntimeClass for the grading pods (``gvisor``); empty: the cluster's default."""
