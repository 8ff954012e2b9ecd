"""One set of cases every sandbox backend must pass, run against each backend (``local``; ``docker`` with -m docker;
``kubernetes`` when ``KUBECONFIG`` points at a real cluster).

A backend that lacks something on purpose declares it in ``KNOWN_GAPS``; the cases that test it are skipped
for that backend with the gap's text as the reason. Every case uses an evaluation id of its own and removes
what it started, so the cases (and other sandboxes on the host) never touch each other.
"""

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from executor.kernel import KernelClient
from services.errors import SandboxError, SandboxUnavailableError
from services.sandbox.base import EXEC_TIMEOUT_STATUS, SandboxBackend, SandboxSpec
from services.sandbox.contract import (
    DEFAULT_SANDBOX_IMAGE,
    GRADING_NAME_PREFIX,
    GRADING_ROLE,
    ROLE_LABEL,
    SANDBOX_NAME_PREFIX,
    SANDBOX_UID,
    SandboxHandle,
)
from services.sandbox.grading import grading_archive, grading_spec
from services.sandbox.local import LocalSandboxBackend

SANDBOX_IMAGE = DEFAULT_SANDBOX_IMAGE

CANARY_NAME = "PBE_CANARY_SECRET"
CANARY_VALUE = f"canary-{uuid.uuid4().hex}"
"""Set in the executor's (this test process's) environment before the shared sandbox starts."""

KNOWN_GAPS: dict[str, dict[str, str]] = {
    "local": {
        "isolation": "the local backend does not isolate: the kernel runs as the executor's user on the host "
        "(its files, its processes and their environments through /proc)",
        "network": "the local backend does not isolate: the kernel has the host's network",
        "limits": "the local backend sets no memory, CPU or process limits",
    },
    "docker": {},
    "kubernetes": {
        "limits": "Kubernetes has no process limit per pod: the kubelet's podPidsLimit applies, not the spec's pids",
        "read_only_grading": "exec runs as the pod's user, so the files put into a grading's pod belong to the user "
        "the checks run as: a check can change them, within the pod's size cap",
    },
}
"""What each backend lacks on purpose, by the name the cases ask for."""


def require(kind: "Kind", capability: str) -> None:
    """Skip the case when the backend declares ``capability`` a known gap."""
    gap = KNOWN_GAPS[kind.name].get(capability)
    if gap is not None:
        pytest.skip(gap)


@dataclass(frozen=True)
class Kind:
    """One backend under test: how to make an instance (as another process would), and how to look behind it."""

    name: str
    image: str
    make: Callable[[], SandboxBackend]
    exists: Callable[[SandboxHandle], bool]
    """Whether anything of the sandbox is left on the host (process, folder, container)."""


def _local_exists(handle: SandboxHandle) -> bool:
    pid, _, folder = handle.sandbox_id.partition(":")
    try:
        process = psutil.Process(int(pid))
        running = process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        running = False
    return running or Path(folder).exists()


def _docker_exists(handle: SandboxHandle) -> bool:
    import docker.client
    import docker.errors

    engine = docker.client.from_env()
    try:
        engine.containers.get(handle.sandbox_id)
        return True
    except docker.errors.NotFound:
        return bool(engine.volumes.list(filters={"name": handle.name}))


def _kubernetes_exists(handle: SandboxHandle) -> bool:
    from kubernetes.client.rest import ApiException

    from services.sandbox.kubernetes import KubernetesSandboxBackend

    backend = KubernetesSandboxBackend(os.environ.get("PBE_K8S_NAMESPACE", "pybench-eval-sandboxes"))
    try:
        backend.core.read_namespaced_pod(handle.name, backend.namespace)
        return True
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise


@pytest.fixture(scope="module", params=["local", pytest.param("docker", marks=pytest.mark.docker), "kubernetes"])
def kind(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Kind:
    if request.param == "local":
        root = tmp_path_factory.mktemp("local-sandboxes")
        return Kind("local", "local", lambda: LocalSandboxBackend(root=root), _local_exists)
    if request.param == "kubernetes":
        # A real cluster, with the sandbox image loaded and the manifests applied; pod IPs reachable from here.
        kubeconfig = os.environ.get("KUBECONFIG", "")
        if not kubeconfig or not all(Path(path).is_file() for path in kubeconfig.split(os.pathsep)):
            pytest.skip("KUBECONFIG does not point at a real cluster's configuration (no Kubernetes API here)")
        from services.sandbox.kubernetes import KubernetesSandboxBackend

        namespace = os.environ.get("PBE_K8S_NAMESPACE", "pybench-eval-sandboxes")
        runtime_class = os.environ.get("PBE_K8S_RUNTIME_CLASS") or None
        return Kind(
            "kubernetes",
            SANDBOX_IMAGE,
            lambda: KubernetesSandboxBackend(namespace, runtime_class),
            _kubernetes_exists,
        )
    from services.sandbox.docker import DockerSandboxBackend

    network: str = request.getfixturevalue("sandbox_network")
    return Kind("docker", SANDBOX_IMAGE, lambda: DockerSandboxBackend(network=network), _docker_exists)


@pytest.fixture(scope="module")
def backend(kind: Kind) -> SandboxBackend:
    return kind.make()


@pytest.fixture()
def evaluation_id(backend: SandboxBackend) -> Iterator[str]:
    """An evaluation id of this case's own; whatever the case leaves under it is reaped afterwards."""
    evaluation_id = f"conf-{uuid.uuid4().hex[:10]}"
    yield evaluation_id
    backend.reap(evaluation_id=evaluation_id)


def spec(kind: Kind, evaluation_id: str, task_index: int = 1, **limits: int) -> SandboxSpec:
    return SandboxSpec(evaluation_id=evaluation_id, task_index=task_index, attempt=2, image=kind.image, **limits)


@pytest.fixture(scope="module")
def shared(kind: Kind, backend: SandboxBackend) -> Iterator[SandboxHandle]:
    """One sandbox for the cases that only look (started with the canary in the executor's environment)."""
    evaluation_id = f"conf-shared-{uuid.uuid4().hex[:10]}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CANARY_NAME, CANARY_VALUE)
        handle = backend.start(spec(kind, evaluation_id, task_index=7))
    yield handle
    backend.stop(handle)
    backend.reap(evaluation_id=evaluation_id)


@pytest.fixture(scope="module")
def kernel(backend: SandboxBackend, shared: SandboxHandle) -> Iterator[KernelClient]:
    client = KernelClient(shared.url, shared.token, probe_scope=backend.telemetry_scope)
    client.start()
    yield client
    client.close()


def run(kernel: KernelClient, code: str, timeout_s: float = 60) -> str:
    """Run a cell that must succeed; return what it printed."""
    execution, output = kernel.execute(code, timeout_s=timeout_s)
    assert execution.ok, output.items
    return "".join(item.text for item in output.items if item.kind == "stream")


# --- start and the handle ---------------------------------------------------------------------------------


def test_start_gives_a_labelled_handle_whose_gateway_answers_only_with_its_token(shared: SandboxHandle) -> None:
    assert shared.name.startswith(SANDBOX_NAME_PREFIX)
    labels = shared.labels  # spelled out: operators filter on these exact keys (README, `make reap`)
    assert labels["pybench-eval.evaluation"].startswith("conf-shared-")
    assert labels["pybench-eval.task"] == "7" and labels["pybench-eval.attempt"] == "2"
    assert labels["pybench-eval.role"] == "sandbox" and labels["pybench-eval.project"] == "pybench-eval"
    with httpx.Client(timeout=10) as http:
        assert http.get(f"{shared.url}/api", headers={"Authorization": f"token {shared.token}"}).status_code == 200
        assert http.get(f"{shared.url}/api/kernels").status_code in (401, 403)


def test_a_cell_runs_and_prints(kernel: KernelClient) -> None:
    assert run(kernel, "print(6 * 7)") == "42\n"


def test_a_cell_past_its_timeout_is_interrupted_and_the_kernel_lives_on(kernel: KernelClient) -> None:
    execution, _ = kernel.execute("import time\nmarker = 'kept'\ntime.sleep(60)", timeout_s=1)
    assert execution.timed_out and not execution.kernel_restarted and execution.duration_s < 15
    assert run(kernel, "print(marker)") == "kept\n"


def test_the_kernel_works_in_the_workspace_and_reads_what_put_file_wrote(
    backend: SandboxBackend, shared: SandboxHandle, kernel: KernelClient
) -> None:
    data = b"a,b\n1,2\n\x00\xff binary tail"
    backend.put_file(shared, "/workspace/data/x.csv", data)
    printed = run(
        kernel, "import os\nprint(os.path.basename(os.getcwd()))\nprint(open('./data/x.csv', 'rb').read().hex())"
    )
    assert printed == f"workspace\n{data.hex()}\n"


def test_put_file_makes_missing_folders_and_refuses_paths_outside_the_workspace(
    backend: SandboxBackend, shared: SandboxHandle, kernel: KernelClient
) -> None:
    backend.put_file(shared, "/workspace/data/nested/deeper/n.txt", b"deep")
    assert run(kernel, "print(open('./data/nested/deeper/n.txt').read())") == "deep\n"
    for dest in ("/etc/pbe-conformance", "/workspace/../etc/pbe-conformance", "/workspace/data/../../x"):
        with pytest.raises(SandboxError) as raised:
            backend.put_file(shared, dest, b"x")
        assert not isinstance(raised.value, SandboxUnavailableError), dest
    assert not Path("/etc/pbe-conformance").exists()


def test_each_cell_reports_its_cpu_time_and_peak_memory(kernel: KernelClient) -> None:
    execution, _ = kernel.execute(
        "import time\nbuffer = bytearray(200 * 2**20)\nend = time.process_time() + 0.3\n"
        "while time.process_time() < end:\n    pass\ndel buffer",
        timeout_s=60,
    )
    assert execution.ok and execution.telemetry_scope in ("cgroup", "process")
    assert execution.cpu_s is not None and 0.25 <= execution.cpu_s < 5
    assert execution.peak_memory_mb is not None and execution.peak_memory_mb >= 200


def test_files_the_kernel_writes_to_output_come_back_and_links_are_skipped(
    backend: SandboxBackend, shared: SandboxHandle, kernel: KernelClient
) -> None:
    run(
        kernel,
        "import os\n"
        "os.makedirs('./output/sub/deeper', exist_ok=True)\n"
        "os.makedirs('./output/game/assets', exist_ok=True)\n"
        "open('./output/result.csv', 'w').write('x\\n1\\n')\n"
        "open('./output/sub/deeper/b.bin', 'wb').write(bytes(range(256)))\n"
        "os.symlink('/etc/hostname', './output/link-to-file')\n"
        "os.symlink('/etc', './output/link-to-folder')\n"
        "os.symlink('../data', './output/sub/link-to-data')",
    )
    assert backend.get_tree(shared, "/workspace/output").files == {
        "result.csv": b"x\n1\n",
        "sub/deeper/b.bin": bytes(range(256)),
        "game/assets/": b"",  # an empty folder is a result too (task 140: "save the files to a folder")
    }


CAPPED_FOLDER = {
    "a.txt": b"a" * 10,
    "b/1.txt": b"b" * 10,
    "b/2.txt": b"c" * 10,
    "c/": b"",
    "d.txt": b"d" * 10,
    "e/f/": b"",
    "z.bin": b"z" * 100,
}
"""A folder to collect under caps: every backend must keep the same entries (the first by name that fit)."""


@pytest.mark.parametrize(
    ("max_files", "max_bytes", "kept", "first_dropped"),
    [
        (1000, 2**20, list(CAPPED_FOLDER), None),
        (4, 2**20, ["a.txt", "b/1.txt", "b/2.txt", "c/"], "d.txt"),
        (1000, 35, ["a.txt", "b/1.txt", "b/2.txt", "c/"], "d.txt"),
        (1000, 99, ["a.txt", "b/1.txt", "b/2.txt", "c/", "d.txt", "e/f/"], "z.bin"),
        (0, 2**20, [], "a.txt"),
    ],
)
def test_get_tree_keeps_the_first_entries_by_name_within_the_caps_and_counts_the_rest(
    backend: SandboxBackend,
    shared: SandboxHandle,
    kernel: KernelClient,
    max_files: int,
    max_bytes: int,
    kept: list[str],
    first_dropped: str | None,
) -> None:
    run(
        kernel,
        "import os, shutil\nshutil.rmtree('./capped', ignore_errors=True)\n"
        f"for name, data in {CAPPED_FOLDER!r}.items():\n"
        "    os.makedirs(os.path.dirname('./capped/' + name), exist_ok=True)\n"
        "    if not name.endswith('/'):\n"
        "        open('./capped/' + name, 'wb').write(data)",
    )
    tree = backend.get_tree(shared, "/workspace/capped", max_files=max_files, max_bytes=max_bytes)
    assert tree.files == {name: CAPPED_FOLDER[name] for name in kept}
    assert tree.first_dropped == first_dropped and tree.truncated is (first_dropped is not None)
    assert (tree.found_entries, tree.found_bytes) == (7, 140)
    note = tree.note("./capped")
    if first_dropped is None:
        assert note is None
    else:
        assert note is not None and f"from ./capped/{first_dropped} on" in note and "7 entries" in note


def test_a_sparse_file_of_100_gib_in_output_costs_a_bounded_read_and_is_never_collected(
    backend: SandboxBackend, evaluation_id: str, kind: Kind
) -> None:
    handle = backend.start(spec(kind, evaluation_id))
    try:
        script = (
            "mkdir -p output && printf small > output/a.txt && "
            "python3 -c \"f = open('output/huge.bin', 'wb'); f.seek(100 * 2**30); f.write(b'x')\""
        )
        assert backend.exec(handle, ["sh", "-c", script], timeout_s=30).exit_code == 0
        started = time.monotonic()
        tree = backend.get_tree(handle, "/workspace/output", max_bytes=2**20)
        elapsed = time.monotonic() - started
        assert "huge.bin" not in tree.files and tree.truncated
        assert elapsed < 60, f"collecting ./output took {elapsed:.0f} s: the sparse file was read through"
        note = tree.note("./output") or ""
        assert "sparse" in note or "huge.bin" in note, note
        backend.put_file(handle, "/workspace/data/after", b"1")  # the backend still answers for this sandbox
    finally:
        backend.stop(handle)


def test_get_tree_of_a_missing_folder_is_empty(backend: SandboxBackend, shared: SandboxHandle) -> None:
    assert backend.get_tree(shared, "/workspace/no-such-folder").files == {}


def test_the_executors_environment_does_not_reach_the_kernel(shared: SandboxHandle, kernel: KernelClient) -> None:
    environment = json.loads(run(kernel, "import os, json\nprint(json.dumps(dict(os.environ)))"))
    assert CANARY_NAME not in environment
    assert not any(CANARY_VALUE in value for value in environment.values())
    assert "KG_AUTH_TOKEN" not in environment
    assert not any(shared.token in value for value in environment.values())


# --- exec: one command beside the kernel ----------------------------------------------------------------------


def test_exec_runs_in_the_workspace_reads_its_stdin_and_reports_how_it_ended(
    backend: SandboxBackend, shared: SandboxHandle
) -> None:
    backend.put_file(shared, "/workspace/data/exec.txt", b"from put_file")
    script = "cat data/exec.txt; echo; cat; echo to-stderr >&2; exit 3"
    result = backend.exec(shared, ["sh", "-c", script], stdin=b"from stdin", timeout_s=30)
    assert (result.exit_code, result.timed_out, result.truncated) == (3, False, False)
    assert result.stdout == b"from put_file\nfrom stdin" and result.stderr == b"to-stderr\n"
    without_stdin = backend.exec(shared, ["cat"], timeout_s=30)  # no stdin: end of file at once, never a hang
    assert (without_stdin.exit_code, without_stdin.stdout) == (0, b"")
    with pytest.raises(ValueError):
        backend.exec(shared, [])


def test_exec_is_killed_at_its_time_limit_and_keeps_only_the_first_bytes_of_a_flood(
    backend: SandboxBackend, shared: SandboxHandle
) -> None:
    started = time.monotonic()
    flood = "head -c 20000000 /dev/zero; sleep 60"
    result = backend.exec(shared, ["sh", "-c", flood], timeout_s=3, max_output_bytes=1000)
    elapsed = time.monotonic() - started
    assert result.timed_out and result.exit_code == EXEC_TIMEOUT_STATUS, result
    assert result.truncated and result.stdout == b"\0" * 1000
    assert elapsed < 15, f"a 3 s command took {elapsed:.1f} s to be killed"
    assert backend.exec(shared, ["true"], timeout_s=30).exit_code == 0  # the sandbox lives on


def test_exec_gets_none_of_the_executors_environment_nor_the_gateways_token(
    backend: SandboxBackend, shared: SandboxHandle
) -> None:
    result = backend.exec(shared, ["env"], timeout_s=30)
    assert result.exit_code == 0
    assert CANARY_VALUE.encode() not in result.stdout and shared.token.encode() not in result.stdout


def test_exec_runs_as_the_sandbox_user(kind: Kind, backend: SandboxBackend, shared: SandboxHandle) -> None:
    require(kind, "isolation")
    result = backend.exec(shared, ["id", "-u"], timeout_s=30)
    assert result.stdout.strip() == str(SANDBOX_UID).encode()


# --- isolation (known gaps of the local backend) ------------------------------------------------------------


@pytest.fixture()
def host_process_with_canary() -> Iterator[int]:
    """A process of the host with the canary in its environment (``/proc/<pid>/environ`` shows only what a
    process started with, so the canary must be there at its start)."""
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], env={**os.environ, CANARY_NAME: CANARY_VALUE}
    )
    yield process.pid
    process.kill()
    process.wait()


def test_the_kernel_cannot_see_the_hosts_processes(
    kind: Kind, kernel: KernelClient, host_process_with_canary: int
) -> None:
    require(kind, "isolation")
    printed = run(
        kernel,
        "import glob\nfound = []\n"
        "for path in glob.glob('/proc/[0-9]*/environ'):\n"
        "    try:\n"
        f"        found += [path] if {CANARY_VALUE!r}.encode() in open(path, 'rb').read() else []\n"
        "    except OSError:\n"
        "        pass\n"
        "print(found)",
    )
    assert printed == "[]\n"


def test_the_kernel_cannot_write_outside_its_workspace(kind: Kind, kernel: KernelClient) -> None:
    require(kind, "isolation")
    probe = f"pbe-probe-{uuid.uuid4().hex[:8]}"
    printed = run(
        kernel,
        "import os\nwritten = []\n"
        f"for path in ('/usr/{probe}', '/etc/{probe}', '/opt/{probe}'):\n"
        "    try:\n"
        "        open(path, 'w').close()\n"
        "        written.append(path)\n"
        "        os.remove(path)\n"
        "    except OSError:\n"
        "        pass\n"
        "print(written)",
    )
    assert printed == "[]\n"


def test_the_kernel_has_no_network(kind: Kind, kernel: KernelClient) -> None:
    require(kind, "network")
    printed = run(
        kernel,
        "import socket\nreached = []\n"
        "try:\n"
        "    socket.getaddrinfo('pypi.org', 443)\n"
        "    reached.append('dns')\n"
        "except OSError:\n"
        "    pass\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 53), timeout=3).close()\n"
        "    reached.append('tcp')\n"
        "except OSError:\n"
        "    pass\n"
        "print(reached)",
    )
    assert printed == "[]\n"


def test_the_process_limit_holds(kind: Kind, backend: SandboxBackend, evaluation_id: str) -> None:
    require(kind, "limits")
    handle = backend.start(spec(kind, evaluation_id, pids=96))
    client = KernelClient(handle.url, handle.token)
    try:
        client.start()
        printed = run(
            client,
            "import threading, time\nstarted = 0\n"
            "try:\n"
            "    for _ in range(200):\n"
            "        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
            "        started += 1\n"
            "except RuntimeError:\n"
            "    pass\n"
            "print(started)",
        )
        assert int(printed) < 96
    finally:
        client.close()
        backend.stop(handle)


# --- re-attaching, stopping, reaping ------------------------------------------------------------------------


def test_a_reparsed_handle_lets_another_backend_instance_read_and_stop(
    kind: Kind, backend: SandboxBackend, evaluation_id: str
) -> None:
    handle = backend.start(spec(kind, evaluation_id))
    backend.put_file(handle, "/workspace/data/x.txt", b"hello")
    reparsed = SandboxHandle.model_validate_json(handle.model_dump_json())
    assert reparsed == handle and reparsed.token == handle.token
    other = kind.make()
    assert other.get_tree(reparsed, "/workspace/data").files == {"x.txt": b"hello"}
    other.stop(reparsed)
    assert not kind.exists(handle)


def test_stop_removes_everything_and_a_second_stop_is_harmless(
    kind: Kind, backend: SandboxBackend, evaluation_id: str
) -> None:
    handle = backend.start(spec(kind, evaluation_id))
    assert kind.exists(handle)
    backend.stop(handle)
    assert not kind.exists(handle)
    with httpx.Client(timeout=3) as http, pytest.raises(httpx.HTTPError):
        http.get(f"{handle.url}/api", headers={"Authorization": f"token {handle.token}"})
    backend.stop(handle)


def test_a_stopped_sandbox_is_unavailable(kind: Kind, backend: SandboxBackend, evaluation_id: str) -> None:
    handle = backend.start(spec(kind, evaluation_id))
    backend.stop(handle)
    with pytest.raises(SandboxUnavailableError):
        backend.put_file(handle, "/workspace/data/x.csv", b"x")
    with pytest.raises(SandboxUnavailableError):
        backend.get_tree(handle, "/workspace/output")
    with pytest.raises(SandboxUnavailableError):
        backend.exec(handle, ["true"])


# --- a grading: another use of a sandbox -------------------------------------------------------------------


def test_a_grading_sandbox_reads_what_put_tree_wrote_and_cannot_change_it_nor_reach_a_network(
    kind: Kind, backend: SandboxBackend
) -> None:
    require(kind, "grading")
    handle = backend.start(grading_spec(kind.image))
    try:
        assert handle.name.startswith(GRADING_NAME_PREFIX) and handle.labels[ROLE_LABEL] == GRADING_ROLE
        backend.put_tree(handle, grading_archive({"output/a.csv": b"a\n1\n"}, {"checker.py": b"print(1)"}))
        read = backend.exec(handle, ["cat", "workspace/output/a.csv", "checker.py"], timeout_s=30)
        assert (read.exit_code, read.stdout) == (0, b"a\n1\nprint(1)")
        if KNOWN_GAPS[kind.name].get("isolation") is None and KNOWN_GAPS[kind.name].get("read_only_grading") is None:
            write = backend.exec(handle, ["sh", "-c", "echo x >> workspace/output/a.csv || touch new"], timeout_s=30)
            assert write.exit_code != 0, "the grading's files are writable by the sandbox user"
        if KNOWN_GAPS[kind.name].get("network") is None:
            interfaces = backend.exec(handle, ["ls", "/sys/class/net"], timeout_s=30)
            assert interfaces.stdout.split() == [b"lo"]
    finally:
        backend.stop(handle)
    assert not kind.exists(handle)


def test_reap_removes_an_evaluations_forgotten_sandbox_and_spares_another_evaluations(
    kind: Kind, backend: SandboxBackend, evaluation_id: str
) -> None:
    forgotten = backend.start(spec(kind, evaluation_id))
    other_evaluation = f"conf-{uuid.uuid4().hex[:10]}"
    other = backend.start(spec(kind, other_evaluation))
    try:
        removed = backend.reap(evaluation_id=evaluation_id)
        assert forgotten.name in removed and other.name not in removed
        assert not kind.exists(forgotten)
        assert kind.exists(other)
        assert backend.get_tree(other, "/workspace/output").files == {}
    finally:
        backend.stop(other)
        backend.reap(evaluation_id=other_evaluation)


def test_reap_spares_a_sandbox_younger_than_asked(kind: Kind, backend: SandboxBackend, evaluation_id: str) -> None:
    handle = backend.start(spec(kind, evaluation_id))
    try:
        assert backend.reap(evaluation_id=evaluation_id, older_than_s=3600) == []
        assert kind.exists(handle)
        backend.put_file(handle, "/workspace/data/still-here", b"1")
    finally:
        backend.stop(handle)
