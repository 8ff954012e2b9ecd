"""The kubernetes sandbox backend (the executor's session pods, the grader's grading pods) against a FAKE
Kubernetes API server (``tests.fake_kube_api``: there is no cluster here), whose exec really runs tar and the
checker against a folder per pod, and whose running session pods are played by real kernel gateways.

The pod specs as sent are checked field by field, against the restricted Pod Security Standard (the checks below
are written from its list of controls) and against the Kubernetes 1.32 schema (``kubernetes-validate``).
"""

import copy
import pickle
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from kubernetes import client

from executor.kernel import KernelClient
from executor.settings import ExecutorSettings
from grader.file_checks import checker_sources
from grader.settings import GraderSettings
from services.errors import ConfigurationError, SandboxError, SandboxStartError, SandboxUnavailableError
from services.sandbox import grading
from services.sandbox.base import EXEC_TIMEOUT_STATUS, SandboxSpec
from services.sandbox.contract import UNATTENDED_LIFETIME_S, SandboxHandle
from services.sandbox.docker import DockerSandboxBackend
from services.sandbox.grading_backends import file_check_backend, grading_backend
from services.sandbox.k8s_pods import DEFAULT_NAMESPACE
from services.sandbox.kubernetes import KubernetesSandboxBackend
from services.sandbox.registry import BackendOptions, get_backend, make_backend
from tests.fake_kube_api import FakeKubeAPI
from tests.servers import free_port

NAMESPACE = DEFAULT_NAMESPACE
CHECKER = checker_sources()


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI(tmp_path_factory.mktemp("fake-kube")) as server:
        yield server


@pytest.fixture()
def fake(api: FakeKubeAPI) -> Iterator[FakeKubeAPI]:
    """The module's fake API server, its knobs put back after the test."""
    yield api
    api.fail_pods.clear()
    api.drop_watches = 0
    api.pending_s = 0.3


def configuration(url: str) -> client.Configuration:
    config = client.Configuration()
    config.host = url
    return config


@pytest.fixture()
def backend(fake: FakeKubeAPI) -> KubernetesSandboxBackend:
    return KubernetesSandboxBackend(configuration=configuration(fake.url), gateway_port_for=fake.gateway_port)


def spec(evaluation_id: str | None = None, **overrides: Any) -> SandboxSpec:
    return SandboxSpec(
        evaluation_id=evaluation_id or f"k8s-{uuid.uuid4().hex[:8]}",
        task_index=overrides.pop("task_index", 4),
        attempt=2,
        image="pybench-eval/sandbox:latest",
        ready_timeout_s=overrides.pop("ready_timeout_s", 60),
        **overrides,
    )


def sent_pod(fake: FakeKubeAPI, name: str) -> dict[str, Any]:
    """The manifest of the pod ``name`` as the backend sent it (not a dry run)."""
    for request in fake.requests_to("POST"):
        if request.body["metadata"]["name"] == name and "dryRun" not in request.query:
            return dict(request.body)
    raise AssertionError(f"no pod {name} was created")


# --- the restricted Pod Security Standard, control by control ---------------------------------------------

BASELINE_VOLUME_TYPES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """What in ``pod`` the restricted Pod Security profile (which includes the baseline one) forbids."""
    spec = pod["spec"]
    pod_context = spec.get("securityContext") or {}
    containers = [*spec.get("containers", []), *spec.get("initContainers", []), *spec.get("ephemeralContainers", [])]
    found = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            found.append(f"host namespaces: {key}")
    if (pod_context.get("windowsOptions") or {}).get("hostProcess"):
        found.append("HostProcess")
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if "hostPath" in kinds:
            found.append(f"hostPath volume {volume['name']}")
        if not kinds <= BASELINE_VOLUME_TYPES:
            found.append(f"volume type {sorted(kinds)} of {volume['name']}")
    for sysctl in pod_context.get("sysctls", []):
        if sysctl["name"] not in SAFE_SYSCTLS:
            found.append(f"sysctl {sysctl['name']}")
    pod_nonroot = pod_context.get("runAsNonRoot") is True
    pod_seccomp = (pod_context.get("seccompProfile") or {}).get("type")
    if pod_context.get("runAsUser") == 0:
        found.append("pod runAsUser 0")
    if pod_seccomp == "Unconfined":
        found.append("pod seccomp Unconfined")
    if (pod_context.get("appArmorProfile") or {}).get("type") == "Unconfined":
        found.append("pod AppArmor Unconfined")
    se_type = (pod_context.get("seLinuxOptions") or {}).get("type")
    if se_type not in (None, "", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"):
        found.append(f"pod SELinux type {se_type}")
    for container in containers:
        name = container["name"]
        context = container.get("securityContext") or {}
        if context.get("privileged"):
            found.append(f"{name}: privileged")
        capabilities = context.get("capabilities") or {}
        if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            found.append(f"{name}: adds capabilities {capabilities.get('add')}")
        if "ALL" not in (capabilities.get("drop") or []):
            found.append(f"{name}: does not drop ALL capabilities")
        if any(port.get("hostPort") for port in container.get("ports", [])):
            found.append(f"{name}: hostPort")
        if context.get("procMount", "Default") != "Default":
            found.append(f"{name}: procMount {context['procMount']}")
        if (context.get("appArmorProfile") or {}).get("type") == "Unconfined":
            found.append(f"{name}: AppArmor Unconfined")
        se_type = (context.get("seLinuxOptions") or {}).get("type")
        if se_type not in (None, "", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"):
            found.append(f"{name}: SELinux type {se_type}")
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation is not false")
        nonroot = context.get("runAsNonRoot")
        if nonroot is False or (nonroot is None and not pod_nonroot):
            found.append(f"{name}: runAsNonRoot is not true")
        if context.get("runAsUser") == 0:
            found.append(f"{name}: runAsUser 0")
        seccomp = (context.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccomp profile {seccomp}")
    return found


def test_the_restricted_checks_catch_what_the_profile_forbids() -> None:
    """The checks themselves can fail: a pod that breaks each control is caught on each."""
    pod = {
        "spec": {
            "hostPID": True,
            "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
            "securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]},
            "containers": [
                {
                    "name": "c",
                    "ports": [{"containerPort": 1, "hostPort": 1}],
                    "securityContext": {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}, "runAsUser": 0},
                }
            ],
        }
    }
    found = " | ".join(restricted_violations(pod))
    for control in (
        "hostPID",
        "hostPath",
        "sysctl kernel.msgmax",
        "privileged",
        "adds capabilities",
        "does not drop ALL",
        "hostPort",
        "allowPrivilegeEscalation",
        "runAsNonRoot",
        "runAsUser 0",
        "seccomp profile None",
    ):
        assert control in found, control


# --- the session pod as sent --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def started(api: FakeKubeAPI) -> Iterator[tuple[KubernetesSandboxBackend, SandboxHandle]]:
    """One running session sandbox, from a backend with a runtime class (as the gvisor overlay sets)."""
    backend = KubernetesSandboxBackend(
        configuration=configuration(api.url), runtime_class="gvisor", gateway_port_for=api.gateway_port
    )
    handle = backend.start(
        spec("k8s-shared", memory_mb=768, cpus=0.5, workspace_mb=300, tmp_mb=40, worker="executor-7")
    )
    yield backend, handle
    backend.stop(handle)


def test_the_session_pod_as_sent_is_hardened(
    api: FakeKubeAPI, started: tuple[KubernetesSandboxBackend, SandboxHandle]
) -> None:
    _, handle = started
    pod = sent_pod(api, handle.name)
    assert pod["metadata"]["namespace"] == NAMESPACE and handle.name.startswith("pbe-sbx-k8s-shared-4-a2-")
    assert pod["metadata"]["labels"] == {
        "app.kubernetes.io/part-of": "pybench-eval",
        "app.kubernetes.io/component": "sandbox",
        "pybench-eval.project": "pybench-eval",
        "pybench-eval.role": "sandbox",
        "pybench-eval.evaluation": "k8s-shared",
        "pybench-eval.task": "4",
        "pybench-eval.attempt": "2",
        "pybench-eval.worker": "executor-7",
    }
    spec_ = pod["spec"]
    assert spec_["restartPolicy"] == "Never"
    assert spec_["automountServiceAccountToken"] is False and spec_["enableServiceLinks"] is False
    assert spec_["activeDeadlineSeconds"] == 12 * 3600
    assert spec_["runtimeClassName"] == "gvisor"
    assert not spec_["hostNetwork"] and not spec_["hostPID"] and not spec_["hostIPC"]
    assert spec_["dnsPolicy"] == "None" and spec_["dnsConfig"] == {"nameservers": ["127.0.0.1"]}
    assert spec_["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "fsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    [container] = spec_["containers"]
    assert container["image"] == "pybench-eval/sandbox:latest" and "command" not in container  # the image's program
    assert container["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    limits = {"memory": "768Mi", "cpu": "500m"}
    assert container["resources"] == {"requests": limits, "limits": limits}
    assert container["ports"] == [{"name": "gateway", "containerPort": 8888, "protocol": "TCP"}]
    assert not any(port.get("hostPort") for port in container["ports"])
    # Only the gateway's own token, never anything of the executor's environment.
    assert container["env"] == [{"name": "KG_AUTH_TOKEN", "value": handle.token}]
    volumes = {volume["name"]: volume for volume in spec_["volumes"]}
    mounts = {mount["mountPath"]: volumes[mount["name"]] for mount in container["volumeMounts"]}
    assert {path: volume["emptyDir"] for path, volume in mounts.items()} == {
        "/workspace": {"medium": "Memory", "sizeLimit": "300Mi"},
        "/tmp": {"medium": "Memory", "sizeLimit": "40Mi"},
        "/home/sandbox": {"medium": "Memory", "sizeLimit": "40Mi"},
    }
    assert len(volumes) == 3 and all(set(volume) == {"name", "emptyDir"} for volume in volumes.values())


def test_the_session_pod_passes_the_restricted_profile_and_the_1_32_schema(
    api: FakeKubeAPI, started: tuple[KubernetesSandboxBackend, SandboxHandle]
) -> None:
    pod = sent_pod(api, started[1].name)
    assert restricted_violations(pod) == []
    kubernetes_validate.validate(pod, "1.32", strict=True)
    broken = copy.deepcopy(pod)
    broken["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = "no"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.32", strict=True)


# --- a session: start, a cell, files in and out, stop --------------------------------------------------------


def test_exec_over_the_pods_exec_stream_feeds_stdin_caps_output_and_kills_at_the_limit(
    fake: FakeKubeAPI, backend: KubernetesSandboxBackend
) -> None:
    handle = backend.start(spec())
    try:
        backend.put_file(handle, "/workspace/data/exec.txt", b"from put_file")
        script = "cat data/exec.txt; echo; cat; echo to-stderr >&2; exit 3"
        result = backend.exec(handle, ["sh", "-c", script], stdin=b"from stdin", timeout_s=30)
        assert (result.exit_code, result.timed_out) == (3, False)
        assert result.stdout == b"from put_file\nfrom stdin" and result.stderr == b"to-stderr\n"
        assert backend.exec(handle, ["cat"], timeout_s=30).stdout == b""  # no stdin: end of file at once
        flood = backend.exec(
            handle, ["sh", "-c", "head -c 3000000 /dev/zero; sleep 60"], timeout_s=2, max_output_bytes=100
        )
        assert flood.timed_out and flood.exit_code == EXEC_TIMEOUT_STATUS and flood.stdout == b"\0" * 100
        assert flood.truncated
    finally:
        backend.stop(handle)
    with pytest.raises(SandboxUnavailableError):
        backend.exec(handle, ["true"])


def test_start_runs_a_cell_moves_files_in_and_out_and_stop_removes_the_pod(
    fake: FakeKubeAPI, backend: KubernetesSandboxBackend
) -> None:
    handle = backend.start(spec())
    try:
        assert handle.backend == "kubernetes" and handle.url == f"http://127.0.0.1:{fake.gateway_port(handle.name)}"
        kernel = KernelClient(handle.url, handle.token)
        kernel.start()
        try:
            execution, output = kernel.execute("print(6 * 7)", timeout_s=30)
            assert execution.ok and "".join(item.text for item in output.items) == "42\n"
            data = b"a,b\n1,2\n\x00\xff"
            backend.put_file(handle, "/workspace/data/deep/x.csv", data)
            execution, output = kernel.execute(
                "import os\nprint(open('./data/deep/x.csv', 'rb').read().hex())\n"
                "os.makedirs('./output/sub', exist_ok=True)\nos.makedirs('./output/empty', exist_ok=True)\n"
                "open('./output/a.txt', 'w').write('aaaa')\nopen('./output/sub/b.bin', 'wb').write(bytes(range(256)))\n"
                "open('./output/z.txt', 'w').write('z' * 100)\nos.symlink('/etc/hostname', './output/link')",
                timeout_s=30,
            )
            assert execution.ok and "".join(item.text for item in output.items) == data.hex() + "\n"
        finally:
            kernel.close()
        tree = backend.get_tree(handle, "/workspace/output")
        assert tree.files == {"a.txt": b"aaaa", "empty/": b"", "sub/b.bin": bytes(range(256)), "z.txt": b"z" * 100}
        capped = backend.get_tree(handle, "/workspace/output", max_files=2, max_bytes=2**20)
        assert capped.files == {"a.txt": b"aaaa", "empty/": b""} and capped.first_dropped == "sub/b.bin"
        assert (capped.found_entries, capped.found_bytes) == (4, 360)
        by_bytes = backend.get_tree(handle, "/workspace/output", max_bytes=300)
        assert list(by_bytes.files) == ["a.txt", "empty/", "sub/b.bin"] and by_bytes.first_dropped == "z.txt"
        assert backend.get_tree(handle, "/workspace/no-such-folder").files == {}
        for dest in ("/etc/x", "/workspace/../etc/x", "/workspace/data/../../x"):
            with pytest.raises(SandboxError) as raised:
                backend.put_file(handle, dest, b"x")
            assert not isinstance(raised.value, SandboxUnavailableError)
        execs = fake.requests_to("EXEC", f"/pods/{handle.name}/exec")
        assert execs and all(r.query["container"] == ["sandbox"] and r.query["tty"] == ["False"] for r in execs)
    finally:
        backend.stop(handle)
    assert handle.name not in fake.pod_names()
    with pytest.raises(SandboxUnavailableError, match="is gone"):
        backend.get_tree(handle, "/workspace/output")
    with pytest.raises(SandboxUnavailableError):
        backend.put_file(handle, "/workspace/data/x", b"x")


def test_stop_of_a_pod_already_gone_does_not_raise(fake: FakeKubeAPI, backend: KubernetesSandboxBackend) -> None:
    handle = backend.start(spec())
    backend.stop(handle)
    deletes = len(fake.requests_to("DELETE", handle.name))
    backend.stop(handle)  # answered 404
    assert len(fake.requests_to("DELETE", handle.name)) == deletes + 1
    never = handle.model_copy(update={"name": "pbe-sbx-never-existed"})
    backend.stop(never)
    down = KubernetesSandboxBackend(configuration=configuration(f"http://127.0.0.1:{free_port()}"))
    down.stop(handle)  # the API away: still no exception


# --- pods that do not start ---------------------------------------------------------------------------------


def test_a_pod_that_fails_while_starting_raises_why_and_is_removed(
    fake: FakeKubeAPI, backend: KubernetesSandboxBackend
) -> None:
    fake.fail_pods["pbe-sbx-failing"] = "exec /usr/bin/tini: no such file"
    with pytest.raises(SandboxStartError) as raised:
        backend.start(spec("failing-1"))
    assert "it ended" in str(raised.value) and "no such file" in str(raised.value)
    [created] = [
        r.body["metadata"]["name"]
        for r in fake.requests_to("POST")
        if r.body["metadata"]["name"].startswith("pbe-sbx-failing")
    ]
    assert fake.requests_to("DELETE", created) and created not in fake.pod_names()


def test_a_pod_deleted_while_starting_raises(fake: FakeKubeAPI, backend: KubernetesSandboxBackend) -> None:
    fake.pending_s = 3.0
    core = client.CoreV1Api(client.ApiClient(configuration(fake.url)))

    def delete_it() -> None:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            names = [name for name in fake.pod_names() if name.startswith("pbe-sbx-deleted")]
            if names:
                core.delete_namespaced_pod(names[0], NAMESPACE)
                return
            time.sleep(0.05)

    deleter = threading.Thread(target=delete_it)
    deleter.start()
    started_at = time.monotonic()
    with pytest.raises(SandboxStartError, match="deleted"):
        backend.start(spec("deleted-1"))
    deleter.join()
    assert time.monotonic() - started_at < 2.5  # told by the watch, not by the pod's phase later


def test_a_watch_that_drops_is_made_again_and_the_start_succeeds(
    fake: FakeKubeAPI, backend: KubernetesSandboxBackend
) -> None:
    fake.pending_s = 1.0
    fake.drop_watches = 2
    handle = backend.start(spec("dropping-1"))
    try:
        watches = [
            r
            for r in fake.requests_to("GET", "/pods")
            if r.query.get("watch") and r.query.get("fieldSelector") == [f"metadata.name={handle.name}"]
        ]
        reads = fake.requests_to("GET", f"/pods/{handle.name}")
        assert len(watches) >= 3 and len(reads) >= 3  # two cut, each followed by a fresh read; then one that told
        assert fake.drop_watches == 0
    finally:
        backend.stop(handle)


def test_a_start_the_api_refuses_says_what_to_do(fake: FakeKubeAPI) -> None:
    forbidden = KubernetesSandboxBackend("forbidden-sandboxes", configuration=configuration(fake.url))
    with pytest.raises(SandboxStartError, match="forbidden in namespace forbidden-sandboxes"):
        forbidden.start(spec())
    missing = KubernetesSandboxBackend("no-such-namespace", configuration=configuration(fake.url))
    with pytest.raises(SandboxStartError, match="does not exist.*kubectl apply"):
        missing.start(spec())


# --- reap ---------------------------------------------------------------------------------------------------


def test_reap_by_evaluation_by_worker_and_by_age(fake: FakeKubeAPI, backend: KubernetesSandboxBackend) -> None:
    old = datetime.now(UTC) - timedelta(hours=2)
    pods = {}
    for evaluation, worker in (("reap-a", "w1"), ("reap-a", "w2"), ("reap-b", "w1"), ("reap-c", "w2")):
        pod_spec = spec(evaluation, worker=worker)
        name = f"pbe-sbx-{evaluation}-{worker}"
        fake.add_pod(NAMESPACE, backend.pod_manifest(pod_spec, name, "token"), old)
        pods[(evaluation, worker)] = name
    young = spec("reap-c", worker="w2")
    fake.add_pod(NAMESPACE, backend.pod_manifest(young, "pbe-sbx-reap-c-young", "t"), datetime.now(UTC))
    grading = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "pbe-grd-leftover",
            "labels": {"pybench-eval.role": "grading-sandbox", "pybench-eval.project": "pybench-eval"},
        },
        "spec": {"containers": [{"name": "sandbox", "image": "i"}]},
    }
    fake.add_pod(NAMESPACE, grading, old)

    assert sorted(backend.reap(evaluation_id="reap-a")) == [pods[("reap-a", "w1")], pods[("reap-a", "w2")]]
    assert backend.reap(worker="w1") == [pods[("reap-b", "w1")]]
    assert backend.reap(worker="w2", older_than_s=3600) == [pods[("reap-c", "w2")]]
    left = fake.pod_names()
    assert "pbe-sbx-reap-c-young" in left and "pbe-grd-leftover" in left
    assert not any(name in left for name in pods.values())
    selectors = [r.query.get("labelSelector", [""])[0] for r in fake.requests_to("GET", "/pods")]
    assert any("pybench-eval.evaluation=reap-a" in s and "pybench-eval.role=sandbox" in s for s in selectors)
    assert backend.reap(purpose="grading") == ["pbe-grd-leftover"]
    backend.reap(evaluation_id="reap-c")


# --- problem() ----------------------------------------------------------------------------------------------


def test_problem_says_why_the_cluster_cannot_be_used(fake: FakeKubeAPI) -> None:
    assert KubernetesSandboxBackend(configuration=configuration(fake.url)).problem() is None
    dry_runs = [r for r in fake.requests_to("POST") if r.query.get("dryRun") == ["All"]]
    assert dry_runs and restricted_violations(dry_runs[-1].body) == []
    assert fake.pod_names().count("pbe-sbx-probe") == 0  # a dry run creates nothing

    down = KubernetesSandboxBackend(configuration=configuration(f"http://127.0.0.1:{free_port()}")).problem()
    assert down is not None and "cannot reach the Kubernetes API" in down and "KUBECONFIG" in down
    forbidden = KubernetesSandboxBackend("forbidden-sandboxes", configuration=configuration(fake.url)).problem()
    assert forbidden is not None and "forbidden in namespace forbidden-sandboxes" in forbidden
    assert "pods/exec" in forbidden
    missing = KubernetesSandboxBackend("no-such-namespace", configuration=configuration(fake.url)).problem()
    assert missing is not None and "does not exist" in missing and "PBE_K8S_NAMESPACE" in missing


def test_problem_without_any_configuration_says_what_to_set(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    problem = KubernetesSandboxBackend().problem()
    assert problem is not None and "KUBECONFIG" in problem


# --- settings and registries --------------------------------------------------------------------------------


def test_the_registry_and_the_grader_settings_choose_kubernetes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PBE_SANDBOX_BACKEND", "kubernetes")
    monkeypatch.setenv("PBE_K8S_NAMESPACE", "elsewhere")
    monkeypatch.setenv("PBE_K8S_RUNTIME_CLASS", "gvisor")
    backend = get_backend(ExecutorSettings())
    assert isinstance(backend, KubernetesSandboxBackend)
    assert (backend.namespace, backend.runtime_class) == ("elsewhere", "gvisor")
    assert GraderSettings().GRADING_BACKEND == "docker"
    monkeypatch.setenv("PBE_GRADING_BACKEND", "kubernetes")
    runner = file_check_backend(GraderSettings(), CHECKER)
    assert getattr(runner, "func", None) is grading.run_file_checks
    [chosen] = getattr(runner, "args", ())
    assert isinstance(chosen, KubernetesSandboxBackend)
    assert (chosen.namespace, chosen.runtime_class) == ("elsewhere", "gvisor")
    assert getattr(runner, "keywords", {}) == {"checker": CHECKER}


def test_sessions_and_gradings_get_their_backends_from_one_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PBE_SANDBOX_RUNTIME_VOLUME", "off")
    docker_grading = grading_backend(GraderSettings())
    assert isinstance(docker_grading, DockerSandboxBackend) and docker_grading.network == ""
    assert docker_grading._runtime_mode == "off"
    with pytest.raises(ConfigurationError, match="unknown sandbox backend 'podman'.*docker, kubernetes, local"):
        make_backend("podman", BackendOptions())
    monkeypatch.setenv("PBE_SANDBOX_BACKEND", "podman")
    with pytest.raises(ConfigurationError, match="PBE_SANDBOX_BACKEND"):
        get_backend(ExecutorSettings())


# --- grading pods -------------------------------------------------------------------------------------------


class _SlowToLoad:
    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return (time.sleep, (30,))


def test_grading_pod_runs_real_checks_on_the_files_and_is_deleted(
    fake: FakeKubeAPI, backend: KubernetesSandboxBackend
) -> None:
    checks = [
        {"kind": "pickle_loads", "path": "./output/model.pkl"},
        {"kind": "dir_has_ext", "dir": "./output/images", "ext": ".png"},
        {"kind": "dir_exists", "path": "./output/never-made"},
        {"kind": "dir_exists", "path": "./output/empty"},
        {"kind": "no-such-kind"},
    ]
    files = {
        "output/empty/": b"",
        "output/model.pkl": pickle.dumps({"weights": [1, 2, 3]}),
        "output/images/a.png": b"\x89PNG",
        "../escape.txt": b"left out",
    }
    before = set(fake.pod_names())
    results = grading.run_file_checks(backend, checks, files, checker=CHECKER, timeout_s=60)
    assert [(r.kind, r.passed) for r in results] == [
        ("pickle_loads", True),
        ("dir_has_ext", True),
        ("dir_exists", False),
        ("dir_exists", True),
        ("no-such-kind", None),
    ]
    assert "builtins.dict" in results[0].detail and "a.png" in results[1].detail
    assert set(fake.pod_names()) == before
    name = next(r.body["metadata"]["name"] for r in reversed(fake.requests_to("POST")))
    assert name.startswith("pbe-grd-") and fake.requests_to("DELETE", name)
    assert not (fake.folder_of(name).parent / "escape.txt").exists()
    pod = sent_pod(fake, name)
    assert restricted_violations(pod) == []
    kubernetes_validate.validate(pod, "1.32", strict=True)
    [container] = pod["spec"]["containers"]
    assert "ports" not in container and container["command"][0] == "sleep"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "grading-sandbox"
    assert pod["metadata"]["labels"]["pybench-eval.role"] == "grading-sandbox"
    assert pod["spec"]["automountServiceAccountToken"] is False and pod["spec"]["enableServiceLinks"] is False
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/workspace", "/tmp", "/home/sandbox"}
    assert container["workingDir"] == "/workspace"
    # nothing of the grader's, nor a token: the checker's few variables are its exec's argv
    assert container["env"] == []
    # the memory-backed workspace counts against the pod's memory: added to the grading's limit
    assert container["resources"]["limits"]["memory"] == f"{grading.DEFAULT_MEMORY_MB + grading.DEFAULT_SPARE_MB}Mi"
    assert pod["spec"]["activeDeadlineSeconds"] == UNATTENDED_LIFETIME_S == int(container["command"][1])


def test_a_grading_that_outlives_its_time_fails_its_checks_and_the_pod_is_deleted(
    fake: FakeKubeAPI, backend: KubernetesSandboxBackend
) -> None:
    checks = [{"kind": "pickle_loads", "path": "./output/slow.pkl"}]
    started_at = time.monotonic()
    slow = {"output/slow.pkl": pickle.dumps(_SlowToLoad())}
    results = grading.run_file_checks(backend, checks, slow, checker=CHECKER, timeout_s=2)
    assert [(r.passed, r.detail) for r in results] == [(False, "grading sandbox timed out after 2 s")]
    assert time.monotonic() - started_at < 15
    assert not any(name.startswith("pbe-grd-") for name in fake.pod_names())


def test_a_grading_pod_the_api_refuses_raises_start_error(fake: FakeKubeAPI, backend: KubernetesSandboxBackend) -> None:
    checks = [{"kind": "dir_exists", "path": "./output"}]
    forbidden = KubernetesSandboxBackend("forbidden-sandboxes", configuration=configuration(fake.url))
    with pytest.raises(SandboxStartError, match="forbidden"):
        grading.run_file_checks(forbidden, checks, {}, checker=CHECKER)
    fake.fail_pods["pbe-grd-"] = "OOMKilled"
    with pytest.raises(SandboxStartError, match="did not start"):
        grading.run_file_checks(backend, checks, {}, checker=CHECKER)
    assert not any(name.startswith("pbe-grd-") for name in fake.pod_names())
