"""The grading sandbox on Kubernetes: checks that open produced files run in a fresh, throwaway pod of the sandbox
image, as ``services.sandbox.grading_docker`` runs them in a container on Docker (same contract, same results).

Each call creates one pod in the sandboxes' namespace, hardened as the session pods are
(``services.sandbox.k8s_pods``: user 1000, read-only root, every capability dropped, no privilege escalation, seccomp
``RuntimeDefault``, no service-account token, no service links, CPU and memory limits, an active deadline), that
only sleeps. It needs no network and gets none: it listens on no port, and the namespace's NetworkPolicy denies
every packet in and out. Through the ``pods/exec`` subresource the files, ``file_checks.py`` (with
``model_loader.py``) and the request go into its memory-backed, size-capped ``/grading`` as a tar archive; then
the checker runs there, by exec, with the image's Python, and prints one JSON line of results. The pod is
deleted when the call returns, whatever happened; ``reap`` removes what a killed grader left behind.

The pod carries ``pybench-eval.role=grading-sandbox``, ``pybench-eval.project=pybench-eval`` and
``app.kubernetes.io/component: grading-sandbox``; its name starts with ``pbe-grd-``.

One difference from the Docker path: exec runs as the pod's user, so the copied files belong to the user the
checks run as (on Docker they belong to root); a check can change them, within the pod's own size cap.
"""

import time
from collections.abc import Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from services.errors import SandboxStartError, SandboxUnavailableError
from services.sandbox import k8s_client
from services.sandbox.contract import DEFAULT_SANDBOX_IMAGE, GRADING_LABELS, grading_name
from services.sandbox.grading import (
    CHECKER_ENVIRONMENT,
    DEFAULT_CPUS,
    DEFAULT_MEMORY_MB,
    DEFAULT_SPARE_MB,
    DEFAULT_TIMEOUT_S,
    DEFAULT_TMP_MB,
    FILES_FOLDER,
    checker_command,
    failed_results,
    grading_archive,
    parse_results,
    request_json,
)
from services.sandbox.k8s_pods import (
    CONTAINER_NAME,
    DEFAULT_NAMESPACE,
    GRADING_COMPONENT,
    pod_labels,
    sandbox_pod,
)
from services.sandbox.kubernetes import KubernetesSandboxBackend
from services.verdict import CheckResult

DEFAULT_START_TIMEOUT_S = 120.0
"""How long the grading pod may take to run (scheduling, image on the node) before the call gives up."""

MOUNT = "/grading"
"""Where the pod's files go: the checker's scripts, ``request.json``, and the session's files under ``workspace/``."""

_KILLED = 137
"""The exit status of a checker killed by SIGKILL (the memory limit, most often)."""


def run_file_checks(
    checks: list[dict[str, Any]],
    files: dict[str, bytes],
    *,
    checker: Mapping[str, bytes],
    image: str = DEFAULT_SANDBOX_IMAGE,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    namespace: str = DEFAULT_NAMESPACE,
    runtime_class: str | None = None,
    configuration: client.Configuration | None = None,
) -> list[CheckResult]:
    """Run ``checks`` (kinds of ``grader.file_checks``) on ``files`` in a fresh grading pod.

    Args:
        checks: the checks, as in the suite's ``checks.json``; paths in them are workspace-relative.
        files: the workspace, by workspace-relative name (``output/2.csv``); a name ending in ``/`` is a folder.
            A name that is absolute or climbs out with ``..`` is left out, and so is a file whose name is also a
            folder's.
        checker: the checker's scripts by file name, the grader's ``grader.file_checks.checker_sources()``.
        image: the sandbox image.
        timeout_s: how long the checks may run once the files are in.
        namespace: the sandboxes' namespace (``PBE_K8S_NAMESPACE``).
        runtime_class: a RuntimeClass for the pod (``PBE_K8S_RUNTIME_CLASS``); None: the cluster's default.
        configuration: the cluster's (default: in-cluster, else ``KUBECONFIG``).

    Returns:
        One result per check, in order; a check that crashed, a garbled or missing answer, a checker killed or
        out of time give failed results that say why. An unknown kind: ``passed`` None.

    Raises:
        SandboxStartError: no cluster configuration, the API refused or lost the pod (forbidden, no namespace,
            image missing), or the pod did not run within ``DEFAULT_START_TIMEOUT_S``.
    """
    if not checks:
        return []
    configuration = configuration or k8s_client.load_configuration()
    core = client.CoreV1Api(client.ApiClient(configuration))
    name = grading_name()
    # The checker runs in the workspace: the request's root is ".".
    archive = grading_archive(files, {**checker, "request.json": request_json(checks, ".")})
    spare_mb = len(archive) // 2**20 + DEFAULT_SPARE_MB
    deadline_s = int(DEFAULT_START_TIMEOUT_S + timeout_s) + 60
    manifest = sandbox_pod(
        name=name,
        namespace=namespace,
        image=image,
        labels=pod_labels(GRADING_LABELS, GRADING_COMPONENT),
        memory_mb=DEFAULT_MEMORY_MB + spare_mb,
        cpus=DEFAULT_CPUS,
        writable={MOUNT: spare_mb, "/tmp": DEFAULT_TMP_MB},
        active_deadline_s=deadline_s,
        env=CHECKER_ENVIRONMENT,
        command=["sleep", str(deadline_s)],
        runtime_class=runtime_class,
        working_dir=MOUNT,
    )
    try:
        try:
            core.create_namespaced_pod(
                namespace, manifest, _preload_content=False, _request_timeout=k8s_client.DEFAULT_API_TIMEOUT_S
            )
        except (ApiException, *k8s_client.TRANSIENT_ERRORS) as exc:
            why = k8s_client.describe_api_error(exc, namespace, configuration.host)
            raise SandboxStartError(f"cannot create grading pod {name}: {why}") from exc
        k8s_client.wait_running(core, name, namespace, time.monotonic() + DEFAULT_START_TIMEOUT_S)
        try:
            copied = k8s_client.run_in_pod(
                configuration,
                name,
                namespace,
                ["sh", "-c", 'head -c "$2" | tar -x -o -f - -C "$1"', "sh", MOUNT, str(len(archive))],
                CONTAINER_NAME,
                archive,
            )
            if copied.exit_code != 0:
                message = copied.stderr.decode(errors="replace").strip()[-300:]
                raise SandboxStartError(f"grading pod {name} refused the files (tar: {message})")
            return _check(configuration, name, namespace, checks, timeout_s)
        except SandboxUnavailableError as exc:
            raise SandboxStartError(f"lost grading pod {name} while grading: {exc}") from exc
    finally:
        k8s_client.delete_pod(core, name, namespace)


def _check(
    configuration: client.Configuration, name: str, namespace: str, checks: list[dict[str, Any]], timeout_s: float
) -> list[CheckResult]:
    """Run the checker in the pod; turn a timeout, a kill or garbage into failed results."""
    output = bytearray()
    command = checker_command(f"{MOUNT}/file_checks.py", f"{MOUNT}/request.json", root=f"{MOUNT}/{FILES_FOLDER}")
    try:
        ended = k8s_client.run_in_pod(
            configuration,
            name,
            namespace,
            command,
            CONTAINER_NAME,
            deadline=time.monotonic() + timeout_s,
            on_stdout=output.extend,
        )
    except TimeoutError:
        return failed_results(checks, f"grading sandbox timed out after {timeout_s:g} s")
    results = parse_results(bytes(output), checks)
    if results is not None:
        return results
    if ended.exit_code == _KILLED:
        return failed_results(
            checks, f"grading sandbox was killed, out of memory ({DEFAULT_MEMORY_MB} MiB) most likely"
        )
    errors = ended.stderr.decode(errors="replace").strip()
    last = errors.splitlines()[-1][:300] if errors else "no output"
    return failed_results(checks, f"grading sandbox gave no results (exit code {ended.exit_code}): {last}")


def reap(
    older_than_s: float = 0.0,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    configuration: client.Configuration | None = None,
) -> list[str]:
    """Delete grading pods older than ``older_than_s`` (a killed grader's leftovers): the Kubernetes backend's
    ``reap`` of gradings.

    Returns:
        The names deleted.

    Raises:
        SandboxStartError: no cluster configuration, or the pods could not be listed.
    """
    backend = KubernetesSandboxBackend(namespace, configuration=configuration)
    return backend.reap(older_than_s=older_than_s, purpose="grading")
