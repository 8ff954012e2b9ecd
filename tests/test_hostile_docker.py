"""Hostile code in a docker sandbox: contained, classified, and leaving nothing behind.

Network probes aim only at decoys this test starts on a Docker network of its own; no test aims at an
outside address.
"""

import os
import resource
import time
from collections.abc import Iterator

import docker
import httpx
import pytest

from executor.kernel import KernelClient
from executor.sandboxes.base import SandboxSpec
from executor.sandboxes.docker import DockerSandboxBackend
from services.sandbox import SandboxHandle
from services.trajectory import Execution

pytestmark = [pytest.mark.docker, pytest.mark.slow]

EVALUATION = "test-hostile"
IMAGE = "pybench-eval/sandbox:latest"
CANARY = "pbe-canary-3d9f0c1b"
MEMORY_MB = 768


class Box:
    """A started sandbox with its kernel."""

    def __init__(self, backend: DockerSandboxBackend, handle: SandboxHandle, kernel: KernelClient) -> None:
        self.backend, self.handle, self.kernel = backend, handle, kernel

    def run(self, code: str, timeout_s: float = 30) -> tuple[Execution, str]:
        execution, output = self.kernel.execute(code, timeout_s=timeout_s)
        text = "".join(item.text for item in output.items)
        return execution, text

    def value(self, expression: str) -> str:
        """What ``print(expression)`` writes to stdout (stderr, e.g. IPython's own warnings, is left out)."""
        execution, output = self.kernel.execute(f"print({expression})", timeout_s=30)
        assert execution.ok, output.items
        return "".join(item.text for item in output.items if item.kind == "stream" and item.name == "stdout").strip()


@pytest.fixture(scope="module")
def backend(sandbox_network: str) -> Iterator[DockerSandboxBackend]:
    backend = DockerSandboxBackend(network=sandbox_network)
    yield backend
    backend.reap(evaluation_id=EVALUATION)
    engine = docker.from_env()
    label = f"pybench-eval.evaluation={EVALUATION}"
    assert not engine.containers.list(all=True, filters={"label": label}), "a sandbox container was left behind"
    assert not engine.volumes.list(filters={"label": label}), "a sandbox volume was left behind"


@pytest.fixture()
def box(backend: DockerSandboxBackend, monkeypatch: pytest.MonkeyPatch) -> Iterator[Box]:
    # A secret in the executor's own environment must not reach the sandbox.
    monkeypatch.setenv("PBE_TEST_SECRET", CANARY)
    spec = SandboxSpec(EVALUATION, 1, 1, image=IMAGE, memory_mb=MEMORY_MB, pids=256, workspace_mb=64, tmp_mb=32)
    handle = backend.start(spec)
    kernel = KernelClient(handle.url, handle.token)
    kernel.start()
    yield Box(backend, handle, kernel)
    kernel.close()
    backend.stop(handle)


def test_runs_unprivileged_with_no_capabilities_and_no_docker_socket(box: Box) -> None:
    assert box.value("__import__('os').getuid()") == "1000"
    status = box.value("open('/proc/self/status').read()")
    assert "CapEff:\t0000000000000000" in status and "NoNewPrivs:\t1" in status
    assert box.value("__import__('os').path.exists('/var/run/docker.sock')") == "False"


def test_no_secret_in_the_kernel_environment_or_proc(box: Box) -> None:
    environ = box.value("dict(__import__('os').environ)")
    assert CANARY not in environ and "KG_AUTH_TOKEN" not in environ
    every_environ = box.value(
        "[open(f'/proc/{p}/environ', 'rb').read() for p in __import__('os').listdir('/proc') if p.isdigit()]"
    )
    assert CANARY not in every_environ
    container = docker.from_env().containers.get(box.handle.sandbox_id)
    assert CANARY not in str(container.attrs["Config"]["Env"])


def test_the_root_filesystem_is_read_only_and_writable_places_are_capped(box: Box) -> None:
    execution, _ = box.run("open('/usr/evil', 'w')")
    assert execution.error_name in ("OSError", "PermissionError")
    for folder, cap_mb in (("/workspace", 64), ("/tmp", 32), ("/home/sandbox", 32)):
        execution, _ = box.run(
            f"with open('{folder}/fill', 'wb') as f:\n    for _ in range(1000):\n        f.write(b'x' * 2**20)"
        )
        assert execution.error_name == "OSError", folder
        written = int(box.value(f"__import__('os').path.getsize('{folder}/fill')"))
        assert written <= cap_mb * 2**20, folder
        box.run(f"__import__('os').remove('{folder}/fill')")
    assert box.value("1 + 1") == "2"


def test_a_fork_bomb_hits_the_process_limit_and_the_kernel_survives(box: Box) -> None:
    execution, _ = box.run(
        "import subprocess\n"
        "procs = []\n"
        "try:\n"
        "    while True:\n"
        "        procs.append(subprocess.Popen(['sleep', '600']))\n"
        "except OSError as exc:\n"
        "    print(type(exc).__name__, len(procs))",
        timeout_s=60,
    )
    assert execution.ok
    container = docker.from_env().containers.get(box.handle.sandbox_id)
    assert container.attrs["HostConfig"]["PidsLimit"] == 256
    assert int(box.value("len(procs)")) < 256
    assert box.value("'still here'") == "still here"


def test_a_single_huge_allocation_fails_inside_the_sandbox(box: Box) -> None:
    execution, _ = box.run("x = bytearray(16 * 1024**3)")
    assert execution.error_name == "MemoryError" or execution.kernel_restarted
    assert box.value("1 + 1") == "2"


def test_growing_memory_kills_only_the_kernel_which_is_restarted(box: Box) -> None:
    execution, _ = box.run("chunks = []\nwhile True:\n    chunks.append(bytearray(64 * 2**20))", timeout_s=60)
    assert execution.kernel_restarted or execution.error_name == "MemoryError"
    assert box.value("'alive again'") == "alive again"


def test_sleep_forever_is_interrupted_at_the_time_limit(box: Box) -> None:
    execution, _ = box.run("import time\ntime.sleep(10**6)", timeout_s=1)
    assert execution.timed_out and not execution.kernel_restarted
    assert box.value("'after'") == "after"


def test_an_endless_loop_that_swallows_interrupts_gets_the_kernel_restarted(box: Box) -> None:
    execution, _ = box.run("while True:\n    try:\n        while True:\n            pass\n    except:\n        pass", 1)
    assert execution.timed_out and execution.kernel_restarted
    assert box.value("'restarted'") == "restarted"


def test_the_kernel_killing_itself_is_reported_as_a_restart(box: Box) -> None:
    execution, _ = box.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    assert execution.kernel_restarted and not execution.timed_out
    assert box.value("'back'") == "back"


@pytest.mark.parametrize(
    "flood",
    [
        "for _ in range(2**14):\n    print('x' * 2**16)",  # 1 GiB in many writes
        "print('y' * (200 * 2**20))",  # one 200 MB line
        "from IPython.display import display\nfor i in range(30000):\n    display(i)",  # many display messages
    ],
)
def test_an_output_flood_is_capped_and_the_kernel_stays_usable(box: Box, flood: str) -> None:
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    execution, output = box.kernel.execute(flood, timeout_s=90)
    assert output.kept_chars <= output.max_chars
    assert execution.truncated or execution.timed_out or len(output.items) < 30000
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) / 1024
    assert grown_mb < 300, f"the executor's memory grew by {grown_mb:.0f} MB while reading a flood"
    assert box.value("'quiet'") == "quiet"


def test_a_kernel_dying_in_the_middle_of_a_flood_is_back_promptly_without_the_old_output(box: Box) -> None:
    """The restarted kernel is reached on new channels under a new session: neither the old ports (a kernel that
    dies within seconds of its start comes back on new ones) nor a replay of the flood the old one left behind."""
    execution, _ = box.kernel.execute(
        "import os, signal\nfor _ in range(2000):\n    print('z' * 2**16)\nos.kill(os.getpid(), signal.SIGKILL)",
        timeout_s=60,
    )
    assert execution.kernel_restarted
    started = time.monotonic()
    execution, output = box.kernel.execute("print('fresh')", timeout_s=30)
    assert execution.ok and not execution.kernel_restarted, output.items
    assert "".join(item.text for item in output.items).strip() == "fresh"
    assert time.monotonic() - started < 20


@pytest.fixture()
def decoys(box: Box) -> Iterator[list[str]]:
    """Two listeners on a network this test creates: stand-ins for an internet host and a metadata service."""
    engine = docker.from_env()
    network = engine.networks.create("pbe-test-decoys", driver="bridge", labels={"pybench-eval.role": "test-decoy"})
    started = []
    try:
        for name in ("pbe-decoy-internet", "pbe-decoy-metadata"):
            container = engine.containers.create(
                IMAGE,
                command=["python3", "-m", "http.server", "8080"],
                name=name,
                network="pbe-test-decoys",
                labels={"pybench-eval.role": "test-decoy"},
            )
            container.start()
            started.append(container)
        addresses = []
        for container in started:
            container.reload()
            addresses.append(container.attrs["NetworkSettings"]["Networks"]["pbe-test-decoys"]["IPAddress"])
        yield addresses
    finally:
        for container in started:
            container.remove(force=True)
        network.remove()


def test_no_route_out_and_no_interface_but_its_own(box: Box, decoys: list[str]) -> None:
    routes = box.value("open('/proc/net/route').read()")
    table = [line.split() for line in routes.splitlines()[1:] if line.strip()]
    assert "00000000" not in [row[1] for row in table], "the sandbox has a default route"
    assert len(table) == 1 and table[0][7] == "FFFFFFFF", f"more than a host route to the executor: {table}"
    assert box.value("sorted(__import__('os').listdir('/sys/class/net'))") == "['eth0', 'lo']"
    for address in decoys:
        execution, text = box.run(
            "import socket\n"
            "s = socket.socket()\n"
            "s.settimeout(2)\n"
            "try:\n"
            f"    s.connect(('{address}', 8080))\n"
            "    print('CONNECTED')\n"
            "except OSError as exc:\n"
            "    print('refused', type(exc).__name__)",
            timeout_s=10,
        )
        assert "CONNECTED" not in text and "refused" in text
    # The host's loopback services (a development Redis on 6379) are not the sandbox's loopback.
    assert box.value("__import__('socket').socket().connect_ex(('127.0.0.1', 6379))") != "0"
    # Names resolve nowhere: the sandbox's resolver is its own loopback.
    execution, _ = box.run("__import__('socket').getaddrinfo('pypi.org', 443)", timeout_s=15)
    assert execution.error_name == "gaierror"


def test_another_sandbox_is_unreachable(box: Box, backend: DockerSandboxBackend) -> None:
    other = backend.start(SandboxSpec(EVALUATION, 4, 1, image=IMAGE))
    try:
        address = other.url.split("//")[1].split(":")[0]
        execution, text = box.run(
            f"import socket\ns = socket.socket()\ns.settimeout(2)\nprint(s.connect_ex(('{address}', 8888)))",
            timeout_s=10,
        )
        assert execution.ok and text.strip() != "0", "a sandbox reached another sandbox's kernel gateway"
        # ...while the executor still reaches both.
        assert box.value("'ok'") == "ok"
        assert httpx.get(f"{other.url}/api", headers={"Authorization": f"token {other.token}"}).status_code == 200
    finally:
        backend.stop(other)


def test_pip_and_apt_fail_fast_instead_of_hanging(box: Box) -> None:
    execution, text = box.run("!pip install --no-cache-dir six-not-a-real-package", timeout_s=60)
    assert not execution.timed_out and execution.duration_s < 50
    execution, text = box.run("!apt-get install -y cowsay", timeout_s=30)
    assert not execution.timed_out


def test_no_workspace_volume_outlives_its_sandbox(backend: DockerSandboxBackend) -> None:
    handle = backend.start(SandboxSpec(EVALUATION, 2, 1, image=IMAGE))
    engine = docker.from_env()
    assert engine.volumes.get(handle.name).attrs["Labels"]["pybench-eval.task"] == "2"
    backend.stop(handle)
    with pytest.raises(docker.errors.NotFound):
        engine.volumes.get(handle.name)


def test_reap_removes_what_a_crashed_worker_left_and_spares_younger_ones(backend: DockerSandboxBackend) -> None:
    handle = backend.start(SandboxSpec(EVALUATION, 3, 1, image=IMAGE))
    assert backend.reap(evaluation_id=EVALUATION, older_than_s=3600) == []
    assert handle.name in backend.reap(evaluation_id=EVALUATION)
    with pytest.raises(docker.errors.NotFound):
        docker.from_env().containers.get(handle.sandbox_id)
    assert os.environ.get("PBE_TEST_SECRET") is None
