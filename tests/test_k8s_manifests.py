"""The ``k8s/`` kustomize tree, offline: every overlay builds with ``kubectl kustomize``, every object validates
against the Kubernetes 1.32 schemas (``kubernetes-validate``), the security model holds in the rendered objects
(restricted Pod Security, default-deny networks, least-privilege RBAC, limits everywhere), and a ``checkov`` scan
fails nothing but the exceptions listed with their reasons in ``k8s/checkov-accepted.yaml``.

``kubectl`` renders the overlays: without it these tests skip, saying so. ``checkov`` and ``kubernetes-validate``
live in their own virtual environments under ``var/tools/`` (``make k8s-tools``); a missing one fails the test
with what to run.
"""

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.endpoint.netguard import EgressPolicy
from services.queues import GRADING_QUEUE, SESSIONS_QUEUE

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "k8s"
TOOLS = ROOT / "var" / "tools"
OVERLAYS = ("local", "gpu", "gvisor")
SERVICE_NS = "pybench-eval"

SANDBOX_NS = "pybench-eval-sandboxes"
KUBERNETES_VERSION = "1.32.0"
ARTIFACT_ROOT = "/var/lib/pybench-eval/artifacts"


def _secret_ref(key: str) -> dict[str, str]:
    """A reference to ``key`` of the stack's one Secret (made by k8s/secrets.sh)."""
    return {"name": "pybench-eval-secrets", "key": key}


CUSTOM_RESOURCES_NOT_VALIDATED = {
    ("keda.sh/v1alpha1", "ScaledObject"): "KEDA's CRD is not among the core Kubernetes schemas that "
    "kubernetes-validate ships; test_keda_scales_executors_on_the_sessions_queue checks its fields instead",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "KEDA's CRD, as above; the same test checks it",
}
"""Objects left out of the schema validation, each with the reason."""

CONTRACT_RULES = {
    ("pods", ("create", "delete", "deletecollection", "get", "list", "watch")),
    ("pods/exec", ("create", "get")),
}
"""What the executor's and the grader's Roles allow in the sandbox namespace: exactly this, nothing else."""

Obj = dict[str, Any]


def _kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.skip("kubectl is not installed: it renders the k8s/ overlays (kubectl kustomize); install kubectl")
    return path


def _tool(venv: str, command: str) -> str:
    path = TOOLS / venv / "bin" / command
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `make k8s-tools` (scripts/install-k8s-tools.sh) to install it")
    return str(path)


def _build(directory: Path) -> list[Obj]:
    done = subprocess.run([_kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"kubectl kustomize {directory} failed:\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Obj]]:
    """Every overlay rendered, by name."""
    return {name: _build(K8S / "overlays" / name) for name in OVERLAYS}


@pytest.fixture(scope="module")
def with_ingress(tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    """The local overlay with the optional Ingress component (a component cannot be built alone)."""
    folder = tmp_path_factory.mktemp("ingress")
    (folder / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(K8S / "overlays" / "local", folder)],
                "components": [os.path.relpath(K8S / "components" / "ingress", folder)],
            }
        )
    )
    return _build(folder)


@pytest.fixture(scope="module")
def suite_loader() -> Obj:
    loaded: Obj = yaml.safe_load((K8S / "suite-loader.yaml").read_text())
    return loaded


def _all_objects(rendered: dict[str, list[Obj]]) -> Iterator[tuple[str, Obj]]:
    for name, objects in rendered.items():
        for obj in objects:
            yield name, obj


def _find(objects: list[Obj], kind: str, name: str, namespace: str | None = SERVICE_NS) -> Obj:
    for obj in objects:
        meta = obj["metadata"]
        if obj["kind"] == kind and meta["name"] == name and meta.get("namespace") == namespace:
            return obj
    raise AssertionError(f"no {kind} {namespace}/{name} in the rendered objects")


def _pod_spec(obj: Obj) -> Obj | None:
    if obj["kind"] == "Pod":
        spec: Obj = obj["spec"]
        return spec
    if obj["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"):
        template: Obj = obj["spec"]["template"]["spec"]
        return template
    return None


def _pod_labels(obj: Obj) -> dict[str, str]:
    labels: dict[str, str] = (obj if obj["kind"] == "Pod" else obj["spec"]["template"])["metadata"]["labels"]
    return labels


def _workloads(objects: list[Obj]) -> Iterator[tuple[Obj, Obj]]:
    for obj in objects:
        spec = _pod_spec(obj)
        if spec is not None:
            yield obj, spec


def _containers(spec: Obj) -> list[Obj]:
    return list(spec.get("initContainers", [])) + list(spec["containers"])


def _settings(objects: list[Obj]) -> dict[str, str]:
    maps = [
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("pybench-eval-settings")
    ]
    assert len(maps) == 1, f"expected one settings ConfigMap, found {[m['metadata']['name'] for m in maps]}"
    data: dict[str, str] = maps[0]["data"]
    return data


def _env_of(objects: list[Obj], workload: Obj) -> dict[str, str]:
    """The environment a workload's first container gets from the settings ConfigMap and its env, as the kubelet
    makes it: a Secret's value stands in as ``secret-<key>``, and ``$(NAME)`` takes an earlier entry's value."""
    container = _containers(_pod_spec(workload) or {})[0]
    env: dict[str, str] = {}
    settings = _settings(objects)
    for source in container.get("envFrom", []):
        assert source["configMapRef"]["name"].startswith("pybench-eval-settings"), source
        env.update(settings)
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), item["value"])
        else:
            env[item["name"]] = "secret-" + item["valueFrom"]["secretKeyRef"]["key"].lower()
    return env


def _selects(selector: Obj, labels: dict[str, str]) -> bool:
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions", []):
        present = expression["key"] in labels
        value = labels.get(expression["key"])
        operator = expression["operator"]
        if operator == "In" and value not in expression["values"]:
            return False
        if operator == "NotIn" and value in expression["values"]:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


# --- building and schema validation ---------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_builds_with_both_namespaces(rendered: dict[str, list[Obj]], overlay: str) -> None:
    objects = rendered[overlay]
    namespaces = {o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"}
    assert namespaces == {SERVICE_NS, SANDBOX_NS}
    for obj in objects:
        if obj["kind"] not in ("Namespace", "RuntimeClass"):
            assert obj["metadata"].get("namespace") in namespaces, f"{obj['kind']} {obj['metadata']['name']}"
    assert not [o for o in objects if o["kind"] == "Secret"], (
        "no Secret may ship in k8s/: the user creates the admin key"
    )


def _validate(paths: list[Path]) -> subprocess.CompletedProcess[str]:
    command = [_tool("kubernetes-validate", "kubernetes-validate"), "-k", KUBERNETES_VERSION, "--strict", "--quiet"]
    return subprocess.run([*command, *map(str, paths)], capture_output=True, text=True, timeout=300)


def test_every_object_validates_against_kubernetes_1_32(
    rendered: dict[str, list[Obj]], with_ingress: list[Obj], suite_loader: Obj, tmp_path: Path
) -> None:
    sets = {**rendered, "local+ingress": with_ingress, "suite-loader": [suite_loader]}
    paths = []
    skipped = set()
    for name, objects in sets.items():
        kept = []
        for obj in objects:
            key = (obj["apiVersion"], obj["kind"])
            if key in CUSTOM_RESOURCES_NOT_VALIDATED:
                skipped.add(key)
            else:
                kept.append(obj)
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump_all(kept))
        paths.append(path)
    done = _validate(paths)
    assert done.returncode == 0, (
        f"objects fail the Kubernetes {KUBERNETES_VERSION} schemas:\n{done.stdout}{done.stderr}"
    )
    assert "WARN" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert skipped == set(CUSTOM_RESOURCES_NOT_VALIDATED), "a listed custom resource is no longer rendered"


def test_the_schema_validation_catches_a_wrong_field(tmp_path: Path) -> None:
    broken = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "x", "namespace": SERVICE_NS},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {"containers": [{"name": "x", "image": "x", "resources": {"limit": {"cpu": "1"}}}]},
            },
        },
    }
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(broken))
    done = _validate([path])
    assert done.returncode != 0 and "limit" in done.stdout + done.stderr


# --- the sandbox namespace -------------------------------------------------------------------------------------


@pytest.mark.parametrize("namespace", [SANDBOX_NS, SERVICE_NS])
def test_namespaces_enforce_the_restricted_pod_security_standard(
    rendered: dict[str, list[Obj]], namespace: str
) -> None:
    for _, obj in _all_objects(rendered):
        if obj["kind"] == "Namespace" and obj["metadata"]["name"] == namespace:
            labels = obj["metadata"]["labels"]
            for mode in ("enforce", "audit", "warn"):
                assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted", (namespace, mode)


def test_sandbox_network_policies_deny_all_egress_and_admit_only_executors(rendered: dict[str, list[Obj]]) -> None:
    for overlay, objects in rendered.items():
        policies = [o for o in objects if o["kind"] == "NetworkPolicy" and o["metadata"]["namespace"] == SANDBOX_NS]
        deny_all = [
            p
            for p in policies
            if p["spec"]["podSelector"] == {}
            and set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"}
            and not p["spec"].get("ingress")
            and not p["spec"].get("egress")
        ]
        assert deny_all, f"{overlay}: no default-deny policy in {SANDBOX_NS}"
        executor = {"app.kubernetes.io/name": "pybench-eval", "app.kubernetes.io/component": "executor"}
        grading = {"app.kubernetes.io/part-of": "pybench-eval", "app.kubernetes.io/component": "grading-sandbox"}
        for policy in policies:
            spec = policy["spec"]
            assert not spec.get("egress"), f"{overlay}: {policy['metadata']['name']} opens egress from sandboxes"
            if not spec.get("ingress"):
                continue
            assert not _selects(spec["podSelector"], grading), "grading sandboxes must get no ingress at all"
            for rule in spec["ingress"]:
                assert rule["ports"] == [{"protocol": "TCP", "port": 8888}], rule
                for peer in rule["from"]:
                    assert "ipBlock" not in peer, rule
                    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": SERVICE_NS}}
                    assert _selects(peer["podSelector"], executor)
                    for other in ("gateway", "grader", "redis", "vllm"):
                        assert not _selects(peer["podSelector"], {**executor, "app.kubernetes.io/component": other})


def test_sandbox_namespace_has_a_quota_and_limit_range(rendered: dict[str, list[Obj]]) -> None:
    for objects in rendered.values():
        quota = _find(objects, "ResourceQuota", "sandbox-quota", SANDBOX_NS)["spec"]["hard"]
        for key in ("pods", "limits.cpu", "limits.memory", "requests.cpu", "requests.memory"):
            assert key in quota
        assert quota["services"] == "0" and quota["persistentvolumeclaims"] == "0" and quota["secrets"] == "0"
        limits = _find(objects, "LimitRange", "sandbox-limits", SANDBOX_NS)["spec"]["limits"][0]
        assert {"cpu", "memory"} <= set(limits["default"]) and {"cpu", "memory"} <= set(limits["max"])


# --- least privilege -------------------------------------------------------------------------------------------


def test_only_executor_and_grader_are_bound_only_in_the_sandbox_namespace(rendered: dict[str, list[Obj]]) -> None:
    for overlay, objects in rendered.items():
        kinds = {o["kind"] for o in objects}
        assert not kinds & {"ClusterRole", "ClusterRoleBinding"}, f"{overlay}: no cluster-wide rights"
        roles = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Role"}
        bindings = [o for o in objects if o["kind"] == "RoleBinding"]
        bound = set()
        for binding in bindings:
            assert binding["metadata"]["namespace"] == SANDBOX_NS, binding["metadata"]
            assert binding["roleRef"]["kind"] == "Role"
            role = roles[binding["roleRef"]["name"]]
            assert role["metadata"]["namespace"] == SANDBOX_NS
            rules = {(res, tuple(sorted(rule["verbs"]))) for rule in role["rules"] for res in rule["resources"]}
            assert rules == CONTRACT_RULES, f"{role['metadata']['name']}: {rules}"
            assert all(rule["apiGroups"] == [""] for rule in role["rules"])
            assert all(not rule.get("resourceNames") for rule in role["rules"])
            for subject in binding["subjects"]:
                assert subject["kind"] == "ServiceAccount" and subject["namespace"] == SERVICE_NS, subject
                bound.add(subject["name"])
        assert bound == {"pybench-eval-executor", "pybench-eval-grader"}, f"{overlay}: {bound}"


def test_gateway_has_no_binding_and_no_token(rendered: dict[str, list[Obj]]) -> None:
    for objects in rendered.values():
        account = _find(objects, "ServiceAccount", "pybench-eval-gateway")
        assert account["automountServiceAccountToken"] is False
        spec = _pod_spec(_find(objects, "Deployment", "gateway"))
        assert spec is not None
        assert spec["serviceAccountName"] == "pybench-eval-gateway" and spec["automountServiceAccountToken"] is False
        for obj in objects:
            for subject in obj.get("subjects", []):
                assert subject["name"] != "pybench-eval-gateway"


def test_only_workers_that_call_the_api_get_a_token(rendered: dict[str, list[Obj]], suite_loader: Obj) -> None:
    for overlay, objects in rendered.items():
        accounts = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ServiceAccount"}
        for workload, spec in [*_workloads(objects), (suite_loader, _pod_spec(suite_loader))]:
            assert spec is not None
            name = workload["metadata"]["name"]
            account = spec.get("serviceAccountName", "default")
            wants_token = name in ("executor", "grader")
            assert spec["automountServiceAccountToken"] is wants_token, f"{overlay}: {name}"
            if account != "default":
                assert accounts[account]["automountServiceAccountToken"] is wants_token, account
            if name in ("gateway", "executor", "grader", "redis", "vllm"):
                assert account.startswith("pybench-eval-"), f"{overlay}: {name} needs a ServiceAccount of its own"


# --- the pods --------------------------------------------------------------------------------------------------

ALLOWED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
"""Volume types the restricted Pod Security Standard admits."""


def _restricted_violations(spec: Obj) -> list[str]:
    """What the restricted Pod Security Standard would refuse in a pod spec (nothing when compliant)."""
    problems = []
    pod_context = spec.get("securityContext", {})
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(flag):
            problems.append(flag)
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            problems.append(f"volume {volume['name']}: {kinds}")
    for container in _containers(spec):
        context = container.get("securityContext", {})
        where = container["name"]
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: allowPrivilegeEscalation must be false")
        if "ALL" not in context.get("capabilities", {}).get("drop", []):
            problems.append(f"{where}: capabilities must drop ALL")
        if set(context.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{where}: adds capabilities")
        if not (context.get("runAsNonRoot") or pod_context.get("runAsNonRoot")):
            problems.append(f"{where}: runAsNonRoot")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            problems.append(f"{where}: runs as root")
        seccomp = context.get("seccompProfile", pod_context.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{where}: seccomp {seccomp}")
        if context.get("privileged"):
            problems.append(f"{where}: privileged")
        if any(port.get("hostPort") for port in container.get("ports", [])):
            problems.append(f"{where}: hostPort")
    return problems


def test_every_pod_meets_restricted_and_is_hardened(rendered: dict[str, list[Obj]], suite_loader: Obj) -> None:
    workloads = [(o, s) for objects in rendered.values() for o, s in _workloads(objects)]
    workloads.append((suite_loader, suite_loader["spec"]))
    for workload, spec in workloads:
        name = workload["metadata"]["name"]
        assert _restricted_violations(spec) == [], name
        assert spec["enableServiceLinks"] is False, name
        for container in _containers(spec):
            assert container["securityContext"]["readOnlyRootFilesystem"] is True, name
            assert container["securityContext"]["runAsUser"] >= 10000, name


def test_the_restricted_check_refuses_a_root_pod() -> None:
    root = {
        "containers": [{"name": "c", "securityContext": {"runAsUser": 0}}],
        "volumes": [{"name": "h", "hostPath": {}}],
    }
    problems = _restricted_violations(root)
    assert any("runs as root" in p for p in problems) and any("hostPath" in p for p in problems)
    assert any("drop ALL" in p for p in problems) and any("seccomp" in p for p in problems)


def test_every_container_has_requests_and_limits(rendered: dict[str, list[Obj]], suite_loader: Obj) -> None:
    workloads = [(o, s) for objects in rendered.values() for o, s in _workloads(objects)]
    workloads.append((suite_loader, suite_loader["spec"]))
    for workload, spec in workloads:
        for container in _containers(spec):
            resources = container["resources"]
            for part in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources.get(part, {})), (workload["metadata"]["name"], part)
        for volume in spec.get("volumes", []):
            if "emptyDir" in volume:
                assert "sizeLimit" in volume["emptyDir"], (workload["metadata"]["name"], volume["name"])


def test_workers_have_a_grace_period_for_a_turn(rendered: dict[str, list[Obj]]) -> None:
    for objects in rendered.values():
        for name in ("executor", "grader"):
            spec = _pod_spec(_find(objects, "Deployment", name))
            assert spec is not None and spec["terminationGracePeriodSeconds"] >= 120, name


def test_selectors_match_their_pods(rendered: dict[str, list[Obj]]) -> None:
    for overlay, objects in rendered.items():
        pods = [(o["metadata"]["name"], _pod_labels(o)) for o, _ in _workloads(objects)]
        for obj in objects:
            if obj["kind"] in ("Deployment", "StatefulSet"):
                assert _selects(obj["spec"]["selector"], _pod_labels(obj)), f"{overlay}: {obj['metadata']['name']}"
                labels = _pod_labels(obj)
                assert labels["app.kubernetes.io/name"] == "pybench-eval" and "app.kubernetes.io/component" in labels
            if obj["kind"] == "Service":
                matched = [n for n, labels in pods if _selects({"matchLabels": obj["spec"]["selector"]}, labels)]
                assert matched == [obj["metadata"]["name"]], f"{overlay}: Service {obj['metadata']['name']}: {matched}"
            if obj["kind"] == "PodDisruptionBudget":
                matched = [n for n, labels in pods if _selects(obj["spec"]["selector"], labels)]
                assert matched == [obj["metadata"]["name"]], f"{overlay}: PDB {obj['metadata']['name']}: {matched}"


def test_every_service_pod_is_under_a_default_deny_policy(rendered: dict[str, list[Obj]]) -> None:
    for overlay, objects in rendered.items():
        policies = [o for o in objects if o["kind"] == "NetworkPolicy" and o["metadata"]["namespace"] == SERVICE_NS]
        assert any(
            p["spec"]["podSelector"] == {} and not p["spec"].get("ingress") and not p["spec"].get("egress")
            for p in policies
        ), overlay
        redis = _find(objects, "NetworkPolicy", "redis-from-services")["spec"]
        assert redis["egress"] == []
        peers = redis["ingress"][0]["from"]
        base = {"app.kubernetes.io/name": "pybench-eval"}
        for component in ("gateway", "executor", "grader"):
            assert any(_selects(p["podSelector"], {**base, "app.kubernetes.io/component": component}) for p in peers)
        for component in ("vllm", "redis", "sandbox"):
            assert not any(
                _selects(p["podSelector"], {**base, "app.kubernetes.io/component": component}) for p in peers
            )
        for policy in policies:
            for rule in policy["spec"].get("egress", []):
                for peer in rule.get("to", []):
                    if "ipBlock" in peer and peer["ipBlock"]["cidr"] == "0.0.0.0/0":
                        assert "169.254.0.0/16" in peer["ipBlock"]["except"], "the metadata service must stay shut"


# --- the services mirror compose and the settings -------------------------------------------------------------


def test_commands_mirror_docker_compose(rendered: dict[str, list[Obj]]) -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    for objects in rendered.values():
        for name in ("gateway", "executor", "grader"):
            container = _containers(_pod_spec(_find(objects, "Deployment", name)) or {})[0]
            assert container["command"] == compose[name]["command"], name
            assert container["image"] == compose[name].get("image", "pybench-eval/app:latest")
        redis = _find(objects, "StatefulSet", "redis")
        args = _containers(_pod_spec(redis) or {})[0]["args"]
        assert args[args.index("--appendonly") + 1] == "yes", "Redis must persist with the append-only file"
        assert redis["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"


def test_settings_are_accepted_by_each_service(rendered: dict[str, list[Obj]], monkeypatch: pytest.MonkeyPatch) -> None:
    from executor.settings import ExecutorSettings
    from gateway.settings import GatewaySettings
    from grader.settings import GraderSettings

    for overlay, objects in rendered.items():
        for name, cls in (("gateway", GatewaySettings), ("executor", ExecutorSettings), ("grader", GraderSettings)):
            deployment = _find(objects, "Deployment", name)
            env = _env_of(objects, deployment)
            for key in [k for k in os.environ if k.startswith("PBE_")]:
                monkeypatch.delenv(key)
            for key, value in env.items():
                monkeypatch.setenv(key, value)
            settings = cls()
            assert settings.REDIS_URL == "redis://:secret-pbe_redis_password@redis:6379/0"
            assert str(settings.ARTIFACT_ROOT) == ARTIFACT_ROOT
            command = _containers(_pod_spec(deployment) or {})[0]["command"]
            if command[0] == "rq":
                assert env["RQ_REDIS_URL"] == settings.REDIS_URL, f"{overlay}: {name}"
                assert command[-1] == (SESSIONS_QUEUE if name == "executor" else GRADING_QUEUE)
            mounts = {m["mountPath"]: m for m in _containers(_pod_spec(deployment) or {})[0]["volumeMounts"]}
            assert ARTIFACT_ROOT in mounts and mounts[str(settings.SUITE_PATH)]["readOnly"] is True
        env = _settings(objects)
        assert env["PBE_SANDBOX_BACKEND"] == "kubernetes" and env["PBE_GRADING_BACKEND"] == "kubernetes"
        assert env["PBE_K8S_NAMESPACE"] == SANDBOX_NS
        assert "PBE_ADMIN_KEY" not in env, "the admin key comes from the Secret, never the ConfigMap"
        assert "PBE_REDIS_URL" not in env, "Redis's URL carries its password: it comes from the Secret"
        password = {"name": "PBE_REDIS_PASSWORD", "valueFrom": {"secretKeyRef": _secret_ref("PBE_REDIS_PASSWORD")}}
        url = "redis://:$(PBE_REDIS_PASSWORD)@redis:6379/0"
        sealing = {"name": "PBE_SECRETS_KEY", "valueFrom": {"secretKeyRef": _secret_ref("PBE_SECRETS_KEY")}}
        gateway_env = _containers(_pod_spec(_find(objects, "Deployment", "gateway")) or {})[0]["env"]
        assert gateway_env == [
            {"name": "FORWARDED_ALLOW_IPS", "value": "*"},  # uvicorn's, for the Ingress's X-Forwarded-Proto
            {"name": "PBE_ADMIN_KEY", "valueFrom": {"secretKeyRef": _secret_ref("PBE_ADMIN_KEY")}},
            password,
            {"name": "PBE_REDIS_URL", "value": url},
            sealing,
        ]
        for name in ("executor", "grader"):
            container = _containers(_pod_spec(_find(objects, "Deployment", name)) or {})[0]
            assert container["env"] == [
                password,
                {"name": "PBE_REDIS_URL", "value": url},
                sealing,
                {"name": "RQ_REDIS_URL", "value": url},
            ], f"{name} gets Redis's password and the sealing key, not the admin key"
            assert "--url" not in container["command"], "a URL on the command line would show the password"
        redis = _containers(_pod_spec(_find(objects, "StatefulSet", "redis")) or {})[0]
        assert redis["command"] == ["/usr/local/bin/start-redis.sh"]
        assert {e["name"]: e["valueFrom"]["secretKeyRef"]["key"] for e in redis["env"]} == {
            "PBE_REDIS_PASSWORD": "PBE_REDIS_PASSWORD",
            "REDISCLI_AUTH": "PBE_REDIS_PASSWORD",
        }


def test_artifact_volume_is_shared_and_read_write_many_on_clusters(rendered: dict[str, list[Obj]]) -> None:
    for overlay, objects in rendered.items():
        claim = _find(objects, "PersistentVolumeClaim", "pybench-eval-artifacts")
        expected = ["ReadWriteOnce"] if overlay == "local" else ["ReadWriteMany"]
        assert claim["spec"]["accessModes"] == expected, overlay
        for name in ("gateway", "executor", "grader"):
            volumes = (_pod_spec(_find(objects, "Deployment", name)) or {})["volumes"]
            assert {"name": "artifacts", "persistentVolumeClaim": {"claimName": "pybench-eval-artifacts"}} in volumes


# --- the overlays ----------------------------------------------------------------------------------------------


def test_local_overlay_uses_loaded_images_and_one_replica(rendered: dict[str, list[Obj]]) -> None:
    for workload, spec in _workloads(rendered["local"]):
        assert workload["spec"].get("replicas", 1) == 1
        for container in _containers(spec):
            assert container["imagePullPolicy"] == "Never", workload["metadata"]["name"]
    assert not [o for o in rendered["local"] if o["kind"] == "ScaledObject"], "no autoscaling on one node"


def test_gvisor_overlay_runs_sandboxes_under_runsc(rendered: dict[str, list[Obj]]) -> None:
    objects = rendered["gvisor"]
    runtime = _find(objects, "RuntimeClass", "gvisor", None)
    assert runtime["handler"] == "runsc"
    for name in ("executor", "grader"):
        assert _env_of(objects, _find(objects, "Deployment", name))["PBE_K8S_RUNTIME_CLASS"] == "gvisor"
    for overlay in ("local", "gpu"):
        assert _settings(rendered[overlay])["PBE_K8S_RUNTIME_CLASS"] == ""


def test_gpu_overlay_serves_vllm_where_evaluations_may_reach_it(rendered: dict[str, list[Obj]]) -> None:
    objects = rendered["gpu"]
    deployment = _find(objects, "Deployment", "vllm")
    spec = _pod_spec(deployment)
    assert spec is not None
    container = spec["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert spec["nodeSelector"] and any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
    assert any(v.get("persistentVolumeClaim", {}).get("claimName") == "vllm-models" for v in spec["volumes"])
    _find(objects, "PersistentVolumeClaim", "vllm-models")
    service = _find(objects, "Service", "vllm")
    assert service["spec"]["ports"][0]["port"] == 8000
    endpoint_host = "vllm.pybench-eval.svc"  # http://vllm.pybench-eval.svc:8000/v1, as docs/kubernetes.md says
    for name in ("gateway", "executor", "grader"):
        policy = EgressPolicy.parse(_env_of(objects, _find(objects, "Deployment", name))["PBE_EGRESS_ALLOWLIST"])
        assert policy.match_name(endpoint_host) is not None, name
        assert policy.match_name("redis.pybench-eval.svc") is None
    assert EgressPolicy.parse(_settings(rendered["local"])["PBE_EGRESS_ALLOWLIST"]).match_name(endpoint_host) is None
    assert "vllm.pybench-eval.svc:8000/v1" in (ROOT / "docs" / "kubernetes.md").read_text()


def test_keda_scales_executors_on_the_sessions_queue(rendered: dict[str, list[Obj]]) -> None:
    for overlay in ("gpu", "gvisor"):
        objects = rendered[overlay]
        scaled = _find(objects, "ScaledObject", "executor")
        target = scaled["spec"]["scaleTargetRef"]
        _find(objects, target["kind"], target["name"])
        assert target == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "executor"}
        [trigger] = scaled["spec"]["triggers"]
        assert trigger["type"] == "redis"
        assert trigger["metadata"]["listName"] == f"rq:queue:{SESSIONS_QUEUE}"
        host, port = trigger["metadata"]["address"].rsplit(":", 1)
        redis = _find(objects, "Service", host.split(".")[0])
        assert (
            host == f"{redis['metadata']['name']}.{SERVICE_NS}.svc" and int(port) == redis["spec"]["ports"][0]["port"]
        )
        assert trigger["metadata"]["listLength"] == _settings(objects)["PBE_SESSIONS_PER_WORKER"]
        assert 1 <= scaled["spec"]["minReplicaCount"] <= scaled["spec"]["maxReplicaCount"]
        authentication = _find(objects, "TriggerAuthentication", trigger["authenticationRef"]["name"])
        assert authentication["spec"]["secretTargetRef"] == [
            {"parameter": "password", **_secret_ref("PBE_REDIS_PASSWORD")}
        ], "Redis asks KEDA for its password too"


def test_ingress_component_routes_to_the_gateway_service(with_ingress: list[Obj]) -> None:
    ingress = _find(with_ingress, "Ingress", "gateway")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    service = _find(with_ingress, "Service", backend["name"])
    assert backend["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}


def test_secrets_script_makes_each_secret_once_and_no_file_holds_one(tmp_path: Path) -> None:
    _kubectl()
    manifests = []
    for out in (tmp_path / "one.env", tmp_path / "one.env", tmp_path / "two.env"):
        done = subprocess.run(
            [str(K8S / "secrets.sh"), str(out), "--print"], capture_output=True, text=True, timeout=60, cwd=ROOT
        )
        assert done.returncode == 0, done.stderr
        manifests.append(yaml.safe_load(done.stdout))
        assert oct(out.stat().st_mode & 0o777) == "0o600"
    meta = manifests[0]["metadata"]
    assert (meta["name"], meta["namespace"]) == ("pybench-eval-secrets", SERVICE_NS)
    assert set(manifests[0]["data"]) == {"PBE_ADMIN_KEY", "PBE_REDIS_PASSWORD", "PBE_SECRETS_KEY"}
    assert manifests[0]["data"] == manifests[1]["data"], "a second run keeps the secrets that work"
    assert manifests[0]["data"] != manifests[2]["data"], "a new file gets new secrets"


# --- the security scan -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_checkov_fails_nothing_but_the_accepted_exceptions(
    rendered: dict[str, list[Obj]], with_ingress: list[Obj], suite_loader: Obj, tmp_path: Path
) -> None:
    scan = tmp_path / "rendered"
    scan.mkdir()
    for name, objects in {**rendered, "local-ingress": with_ingress}.items():
        (scan / f"{name}.yaml").write_text(yaml.safe_dump_all(objects))
    # the loader beside the local overlay, so the graph checks see the namespace's network policies
    (scan / "suite-loader.yaml").write_text(yaml.safe_dump_all([*rendered["local"], suite_loader]))
    done = subprocess.run(
        [_tool("checkov", "checkov"), "-d", str(scan), "--framework", "kubernetes", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.stdout.strip(), f"checkov printed nothing:\n{done.stderr[-2000:]}"
    reports = json.loads(done.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    failed = {(f["check_id"], f["resource"]) for r in reports for f in r["results"]["failed_checks"]}
    passed = [f for r in reports for f in r["results"]["passed_checks"]]
    assert sum(r["summary"]["parsing_errors"] for r in reports) == 0
    assert any(f"{SANDBOX_NS}." in p["resource"] for p in passed), "the sandbox namespace's objects were not scanned"

    accepted_entries = yaml.safe_load((K8S / "checkov-accepted.yaml").read_text())["accepted"]
    accepted = set()
    for entry in accepted_entries:
        assert entry["reason"].strip(), entry["check"]
        for resource in entry["resources"]:
            assert f".{SANDBOX_NS}." not in resource, f"no exception may be accepted in {SANDBOX_NS}: {resource}"
            accepted.add((entry["check"], resource))
    sandbox_failures = sorted(f for f in failed if f".{SANDBOX_NS}." in f[1] or f[1].endswith(f".{SANDBOX_NS}"))
    assert sandbox_failures == [], f"checks failed on the sandbox namespace's objects: {sandbox_failures}"
    assert sorted(failed - accepted) == [], "checks failed that k8s/checkov-accepted.yaml does not accept"
    assert sorted(accepted - failed) == [], "accepted exceptions that no longer fail: remove them"


def test_the_gateway_trusts_the_ingress_forwarded_scheme_so_dashboard_cookies_are_secure(
    rendered: dict[str, list[Obj]], redis_url: str, suite_path: Path, tmp_path: Path
) -> None:
    import threading
    import time

    import httpx
    import uvicorn

    from gateway.app import create_app
    from tests.fixtures import gateway_settings
    from tests.servers import free_port

    objects = rendered["local"]
    allowed = _env_of(objects, _find(objects, "Deployment", "gateway"))["FORWARDED_ALLOW_IPS"]

    def login_cookie(forwarded_allow_ips: str | None) -> str:
        """The sign-in form's Set-Cookie, asked from 127.0.0.2 (not the server's own address) as a TLS proxy would."""
        app = create_app(gateway_settings(redis_url, suite_path, tmp_path))
        port = free_port()
        options = {} if forwarded_allow_ips is None else {"forwarded_allow_ips": forwarded_allow_ips}
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **options))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        try:
            while not server.started:
                assert thread.is_alive(), "the gateway did not start"
                time.sleep(0.02)
            proxy = httpx.HTTPTransport(local_address="127.0.0.2")
            with httpx.Client(transport=proxy) as client:
                response = client.get(
                    f"http://127.0.0.1:{port}/dashboard/login", headers={"X-Forwarded-Proto": "https"}
                )
            assert response.status_code == 200
            return response.headers["set-cookie"]
        finally:
            server.should_exit = True
            thread.join(timeout=10)

    assert "secure" not in login_cookie(None).lower()  # uvicorn's default trusts only 127.0.0.1
    assert "secure" in login_cookie(allowed).lower()
