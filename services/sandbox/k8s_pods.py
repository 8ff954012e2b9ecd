"""The sandbox pods of the Kubernetes backends, as plain manifests: what the executor's session sandboxes and the
grader's grading sandboxes send to the API server. Pure data, no client: tests check it field by field, against
the restricted Pod Security profile and against the Kubernetes schema.

Every pod is hardened as the Docker sandboxes are: it runs as the unprivileged user 1000 (``runAsNonRoot``),
with a read-only root filesystem, every capability dropped, no privilege escalation and the runtime's default
seccomp profile; what it may write is memory-backed and size-capped (``emptyDir`` with ``medium: Memory``);
CPU and memory requests equal their limits; it gets no service-account token, no service links in its
environment, no host namespaces, and names resolve nowhere (its only name server is its own loopback, so a
``pip install`` fails at once). ``activeDeadlineSeconds`` ends a pod that a crashed worker forgot; the reaper
removes it. Its environment holds only what its program needs, never anything of the worker's.

Labels: the Kubernetes ones of the deployment (``app.kubernetes.io/part-of``, ``app.kubernetes.io/component``)
beside the project's own (``services.sandbox``), so the manifests' NetworkPolicy and an operator select the
same pods the reaper does.
"""

from datetime import datetime
from typing import Any

from services.sandbox.contract import GRADING_ROLE, PROJECT, SANDBOX_ROLE, SANDBOX_UID

DEFAULT_NAMESPACE = "pybench-eval-sandboxes"
"""The namespace sandbox pods run in, unless ``PBE_K8S_NAMESPACE`` says otherwise (it enforces Pod Security
``restricted`` and denies all network traffic but the executors' to the kernel gateway)."""

PART_OF_LABEL = "app.kubernetes.io/part-of"
COMPONENT_LABEL = "app.kubernetes.io/component"

SESSION_COMPONENT = SANDBOX_ROLE
"""``app.kubernetes.io/component`` of a session's sandbox pod."""

GRADING_COMPONENT = GRADING_ROLE
"""``app.kubernetes.io/component`` of a grading sandbox pod."""

CONTAINER_NAME = "sandbox"
"""The one container of every sandbox pod (what exec calls name)."""

DEFAULT_TERMINATION_GRACE_S = 2
"""How long a deleted sandbox pod's processes get after SIGTERM: nothing in a sandbox is worth waiting for."""


def pod_labels(project_labels: dict[str, str], component: str) -> dict[str, str]:
    """The labels of a sandbox pod: the project's (``services.sandbox.sandbox_labels`` or the grading ones) and
    the deployment's ``part-of`` and ``component``."""
    return {**project_labels, PART_OF_LABEL: PROJECT, COMPONENT_LABEL: component}


def label_selector(labels: dict[str, str]) -> str:
    """A label selector (``a=b,c=d``) that matches pods carrying all of ``labels``."""
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


def created_epoch(stamp: str) -> float:
    """Seconds since the epoch of a pod's ``creationTimestamp`` (``2026-01-02T03:04:05Z``); 0 if unreadable (so
    the reaper takes it)."""
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _quantity_cpu(cpus: float) -> str:
    return f"{max(1, round(cpus * 1000))}m"


def _memory_volume(name: str, size_mb: int) -> dict[str, Any]:
    return {"name": name, "emptyDir": {"medium": "Memory", "sizeLimit": f"{size_mb}Mi"}}


def sandbox_pod(
    *,
    name: str,
    namespace: str,
    image: str,
    labels: dict[str, str],
    memory_mb: int,
    cpus: float,
    writable: dict[str, int],
    active_deadline_s: int,
    env: dict[str, str] | None = None,
    command: list[str] | None = None,
    ports: dict[str, int] | None = None,
    runtime_class: str | None = None,
    working_dir: str | None = None,
) -> dict[str, Any]:
    """The manifest of one hardened sandbox pod (see the module docstring).

    Args:
        name: the pod's name (``pbe-sbx-...`` or ``pbe-grd-...``).
        namespace: where it runs.
        image: its image; it is never pulled when present on the node (``IfNotPresent``).
        labels: all its labels (``pod_labels``).
        memory_mb: its memory request and limit (the memory-backed folders count against it).
        cpus: its CPU request and limit.
        writable: the writable folders, path to size cap in MiB (``{"/workspace": 1024, "/tmp": 256}``); each is
            a memory-backed ``emptyDir`` of its own.
        active_deadline_s: the most seconds the pod may run before Kubernetes ends it (a safety net).
        env: its whole environment (beyond the image's); never anything of the caller's own.
        command: its command; None: the image's.
        ports: the container ports it listens on, by name.
        runtime_class: a RuntimeClass (``gvisor``) to run it with; None or empty: the cluster's default.
        working_dir: the container's working folder; None: the image's.

    Returns:
        The pod as a dict, ready for ``create_namespaced_pod``.
    """
    mounts = []
    volumes = []
    for index, (path, size_mb) in enumerate(sorted(writable.items())):
        volume = f"writable-{index}"
        volumes.append(_memory_volume(volume, size_mb))
        mounts.append({"name": volume, "mountPath": path})
    resources = {"memory": f"{memory_mb}Mi", "cpu": _quantity_cpu(cpus)}
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "env": [{"name": key, "value": value} for key, value in sorted((env or {}).items())],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": SANDBOX_UID,
            "runAsGroup": SANDBOX_UID,
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": mounts,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if command is not None:
        container["command"] = command
    if working_dir is not None:
        container["workingDir"] = working_dir
    if ports:
        container["ports"] = [
            {"name": port_name, "containerPort": port, "protocol": "TCP"} for port_name, port in sorted(ports.items())
        ]
    spec: dict[str, Any] = {
        "containers": [container],
        "restartPolicy": "Never",
        "activeDeadlineSeconds": active_deadline_s,
        "terminationGracePeriodSeconds": DEFAULT_TERMINATION_GRACE_S,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "dnsPolicy": "None",
        "dnsConfig": {"nameservers": ["127.0.0.1"]},
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": SANDBOX_UID,
            "runAsGroup": SANDBOX_UID,
            "fsGroup": SANDBOX_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumes": volumes,
    }
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": spec,
    }
