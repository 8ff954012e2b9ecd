"""Hostile code in a docker sandbox: contained, classified, and leaving nothing behind.

Network probes aim only at decoys this test starts on a Docker network of its own; no test aims at an
outside address.
"""

import ast
import contextlib
import os
import threading
import time
import tracemalloc
from collections.abc import Iterator

import docker
import httpx
import pytest

from executor.kernel import KernelClient
from executor.output import DEFAULT_MAX_OUTPUT_CHARS
from services.sandbox.base import SandboxSpec
from services.sandbox.contract import EVALUATION_LABEL, LOG_LIMIT, ROLE_LABEL, TASK_LABEL, SandboxHandle
from services.sandbox.docker import DockerSandboxBackend
from services.trajectory import Execution
from tests.fixtures import sandbox_objects

pytestmark = [pytest.mark.docker, pytest.mark.slow]

EVALUATION = "test-hostile"
IMAGE = "pybench-eval/sandbox:latest"
CANARY = "pbe-canary-3d9f0c1b"
MEMORY_MB = 768
FLOOD_MEMORY_MB = 64
"""The most the executor's own memory may grow by while it reads a flood of output (measured: under 15 MB)."""


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
    assert sandbox_objects(**{EVALUATION_LABEL: EVALUATION}) == {}, "a sandbox container or volume was left behind"


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
    # The entrypoint that confined the network as root dropped every capability from every set, for good.
    for held in ("CapPrm", "CapInh", "CapBnd", "CapAmb"):
        assert f"{held}:\t0000000000000000" in status, f"{held} is not empty: {status}"
    processes = box.value(
        "sorted({(f[0], f[1].split()[0], f[2]) for f in ([dict(line.split(':\\t', 1) for line in "
        "open(f'/proc/{p}/status').read().splitlines() if ':\\t' in line)[k] for k in ('Name', 'Uid', 'CapBnd')] "
        "for p in __import__('os').listdir('/proc') if p.isdigit())})"
    )
    found = ast.literal_eval(processes)
    assert {name for name, _, _ in found} >= {"tini", "jupyter-kernelg"}, found
    assert all(uid == "1000" and bounding == "0000000000000000" for _, uid, bounding in found), found
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
    # The root, and the Python environment (served from a read-only volume on a FUSE engine): nothing to plant
    # there for the next sandbox or the grading one.
    for planted in ("/usr/evil", "/opt/venv/lib/python3.11/site-packages/sitecustomize.py", "/opt/venv/evil"):
        execution, _ = box.run(f"open({planted!r}, 'w')")
        assert execution.error_name in ("OSError", "PermissionError"), planted
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


@contextlib.contextmanager
def memory_growth() -> Iterator[dict[str, float]]:
    """Measure how much this process's memory grows while the block runs, in MiB: ``traced``, the peak of
    what Python allocated (tracemalloc, blind to memory freed earlier and kept by the allocator), and ``rss``,
    the peak resident set above its level at the start (sampled every 5 ms from /proc/self/statm)."""
    page = os.sysconf("SC_PAGE_SIZE")

    def resident() -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * page

    start = peak = resident()
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.005):
            peak = max(peak, resident())

    sampler = threading.Thread(target=sample, daemon=True)
    grown: dict[str, float] = {}
    sampler.start()
    tracemalloc.start()
    try:
        yield grown
    finally:
        _, traced_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        done.set()
        sampler.join()
        grown["traced"] = traced_peak / 2**20
        grown["rss"] = (max(peak, resident()) - start) / 2**20


# The sandbox's Jupyter server passes the kernel's output on at most ServerApp.iopub_data_rate_limit (1 MB/s,
# over 3 s) and drops the rest: only a flood slower than that reaches the executor, where its cap applies.
@pytest.mark.parametrize(
    ("flood", "kind", "unit", "count"),
    [
        # 2.6 MB over six seconds, in 64 kB writes
        (
            "import time\nfor _ in range(40):\n    print('x' * 2**16)\n    time.sleep(0.15)",
            "stream",
            "x" * 2**16 + "\n",
            40,
        ),
        # 3 MB in 10000 display messages, under the server's message rate limit (1000 a second)
        (
            "import time\nfrom IPython.display import display\nfor _ in range(10000):\n    display('x' * 300)\n"
            "    time.sleep(0.002)",
            "display",
            f"'{'x' * 300}'",
            10000,
        ),
    ],
    ids=["writes", "displays"],
)
def test_an_output_flood_that_reaches_the_executor_is_capped(
    box: Box, flood: str, kind: str, unit: str, count: int
) -> None:
    with memory_growth() as grown:
        execution, output = box.kernel.execute(flood, timeout_s=90)
    assert not execution.timed_out and not execution.kernel_restarted, execution
    # More than twice the cap reached the executor...
    assert 2 * DEFAULT_MAX_OUTPUT_CHARS < output.kept_chars + output.dropped_chars <= len(unit) * count
    # ...and exactly the cap's worth came back, marked truncated: the flood's first characters (and the server's
    # warnings, if it dropped some).
    returned = "".join(item.text for item in output.items)
    assert execution.truncated and len(returned) == DEFAULT_MAX_OUTPUT_CHARS, len(returned)
    flood_text = "".join(item.text for item in output.items if item.kind == kind and item.name in ("", "stdout"))
    assert len(flood_text) > DEFAULT_MAX_OUTPUT_CHARS - 10_000 and (unit * count).startswith(flood_text)
    for measure in ("traced", "rss"):
        assert grown[measure] < FLOOD_MEMORY_MB, f"the executor's memory ({measure}) grew by {grown[measure]:.0f} MB"
    assert box.value("'quiet'") == "quiet"


@pytest.mark.parametrize(
    "flood",
    [
        "for _ in range(2**14):\n    print('x' * 2**16)",  # 1 GiB in many writes
        "print('y' * (200 * 2**20))",  # one 200 MB line
    ],
    ids=["1-GiB-in-writes", "200-MB-line"],
)
def test_a_flood_too_fast_for_the_server_never_reaches_the_executor(box: Box, flood: str) -> None:
    """Stopped in the sandbox: the server drops output past its rate, or the kernel dies of what it buffers
    (the sandbox's memory limit) and is restarted; the executor's memory stays flat and the kernel usable."""
    with memory_growth() as grown:
        execution, output = box.kernel.execute(flood, timeout_s=90)
    for measure in ("traced", "rss"):
        assert grown[measure] < FLOOD_MEMORY_MB, f"the executor's memory ({measure}) grew by {grown[measure]:.0f} MB"
    returned = "".join(item.text for item in output.items)
    assert len(returned) < DEFAULT_MAX_OUTPUT_CHARS and not execution.truncated, len(returned)
    assert execution.kernel_restarted or "IOPub data rate exceeded" in returned, (execution, returned[:300])
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
    network = engine.networks.create("pbe-test-decoys", driver="bridge", labels={ROLE_LABEL: "test-decoy"})
    started = []
    try:
        for name in ("pbe-decoy-internet", "pbe-decoy-metadata"):
            container = engine.containers.create(
                IMAGE,
                command=["python3", "-m", "http.server", "8080"],
                name=name,
                network="pbe-test-decoys",
                labels={ROLE_LABEL: "test-decoy"},
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
    # No IPv6 address (a link-local one would reach the bridge's other members) on an engine that gives one.
    inet6 = "open('/proc/net/if_inet6').read() if __import__('os').path.exists('/proc/net/if_inet6') else ''"
    assert box.value(inet6) == ""
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


def test_what_code_writes_to_the_containers_own_stdout_is_capped_in_the_engines_log(box: Box) -> None:
    # The kernel keeps a copy of its original stdout, the container log, beside the pipe that captures cells.
    execution, text = box.run(
        "import os, sys\n"
        "line = b'x' * 65535 + b'\\n'\n"
        "for _ in range(512):\n"
        "    os.write(sys.stdout._original_stdstream_copy, line)\n"
        "print('wrote', 512 * len(line))",
        timeout_s=120,
    )
    assert execution.ok and "wrote 33554432" in text, text
    container = docker.from_env().containers.get(box.handle.sandbox_id)
    assert container.attrs["HostConfig"]["LogConfig"] == {"Type": "json-file", "Config": LOG_LIMIT}
    log_path = container.attrs["LogPath"]
    if os.access(log_path, os.R_OK):  # the engine's own file, readable where the tests run as root
        assert os.path.getsize(log_path) <= 9 * 2**20, "the container log outgrew its cap"
    assert box.value("1 + 1") == "2"


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
    """No name resolves in the sandbox, so pip gives up at once (no retries, no prompt) and says so; apt-get,
    run as the unprivileged user, is refused its lock before it could ask anything."""
    execution, text = box.run("!pip install --no-cache-dir six-not-a-real-package", timeout_s=60)
    assert execution.ok and execution.duration_s < 30, (execution, text)
    assert box.value("_exit_code") != "0", text
    # No index answered (no name resolves), so pip found no version at all and said so.
    assert "(from versions: none)" in text and "No matching distribution found for six-not-a-real-package" in text, text
    execution, text = box.run("!apt-get install -y cowsay", timeout_s=30)
    assert execution.ok and execution.duration_s < 15, (execution, text)
    assert box.value("_exit_code") != "0", text
    assert "are you root?" in text, text
    assert "[Y/n]" not in text and "continue?" not in text, text  # nothing waited on a prompt


def test_no_workspace_volume_outlives_its_sandbox(backend: DockerSandboxBackend) -> None:
    handle = backend.start(SandboxSpec(EVALUATION, 2, 1, image=IMAGE))
    engine = docker.from_env()
    assert engine.volumes.get(handle.name).attrs["Labels"][TASK_LABEL] == "2"
    backend.stop(handle)
    with pytest.raises(docker.errors.NotFound):
        engine.volumes.get(handle.name)


def test_reap_removes_what_a_crashed_worker_left_and_spares_younger_ones(backend: DockerSandboxBackend) -> None:
    handle = backend.start(SandboxSpec(EVALUATION, 3, 1, image=IMAGE))  # and never stopped, as by a crash
    left = {("container", handle.name), ("volume", handle.name)}
    assert set(sandbox_objects(**{EVALUATION_LABEL: EVALUATION})) == left
    assert backend.reap(evaluation_id=EVALUATION, older_than_s=3600) == []
    assert set(sandbox_objects(**{EVALUATION_LABEL: EVALUATION})) == left, "reap removed a younger sandbox"
    assert backend.reap(evaluation_id=EVALUATION) == [handle.name]  # the container and its volume, one name
    assert sandbox_objects(**{EVALUATION_LABEL: EVALUATION}) == {}, "reap left the sandbox or its volume"
    with pytest.raises(docker.errors.NotFound):
        docker.from_env().containers.get(handle.sandbox_id)
