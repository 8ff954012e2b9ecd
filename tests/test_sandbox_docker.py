"""The docker sandbox backend and the kernel client, against real containers of the sandbox image."""

import base64
import statistics
import time
from collections.abc import Iterator

import docker
import pytest

from executor.kernel import KernelClient
from services.errors import SandboxStartError, SandboxUnavailableError
from services.sandbox.base import SandboxSpec
from services.sandbox.contract import (
    DEFAULT_SANDBOX_IMAGE,
    EVALUATION_LABEL,
    SANDBOX_NAME_PREFIX,
    TASK_LABEL,
    SandboxHandle,
)
from services.sandbox.docker import DockerSandboxBackend
from services.sandbox.runtime_volumes import RUNTIME_PATHS

pytestmark = pytest.mark.docker

SANDBOX_IMAGE = DEFAULT_SANDBOX_IMAGE


@pytest.fixture(scope="module")
def backend(sandbox_network: str) -> Iterator[DockerSandboxBackend]:
    backend = DockerSandboxBackend(network=sandbox_network)
    yield backend
    backend.reap(evaluation_id="test-sandbox")


@pytest.fixture()
def sandbox(backend: DockerSandboxBackend) -> Iterator[SandboxHandle]:
    handle = backend.start(SandboxSpec(evaluation_id="test-sandbox", task_index=1, attempt=1, image=SANDBOX_IMAGE))
    yield handle
    backend.stop(handle)


@pytest.fixture()
def kernel(sandbox: SandboxHandle) -> Iterator[KernelClient]:
    client = KernelClient(sandbox.url, sandbox.token)
    client.start()
    yield client
    client.close()


def test_the_python_environment_is_the_images_read_only(backend: DockerSandboxBackend, sandbox: SandboxHandle) -> None:
    engine = docker.from_env()
    container = engine.containers.get(sandbox.sandbox_id)
    mounts = {mount["Destination"]: mount for mount in container.attrs["Mounts"]}
    if not backend.runtime.enabled():  # an engine whose storage is not FUSE: the image's own files
        assert not set(RUNTIME_PATHS) & set(mounts)
        return
    copies = backend.runtime.copies_for(engine.images.get(SANDBOX_IMAGE).id)
    for path in RUNTIME_PATHS:
        assert mounts[path]["Type"] == "volume" and mounts[path]["RW"] is False
        assert mounts[path]["Name"] == copies[path]
    assert container.attrs["Image"] == engine.images.get(SANDBOX_IMAGE).id  # created from the copy's image


def test_sandbox_runs_as_labelled_unprivileged_container_on_internal_network(
    backend: DockerSandboxBackend, sandbox: SandboxHandle
) -> None:
    container = docker.from_env().containers.get(sandbox.sandbox_id)
    config = container.attrs["HostConfig"]
    assert container.name.startswith(SANDBOX_NAME_PREFIX)
    assert container.labels[EVALUATION_LABEL] == "test-sandbox"
    assert container.labels[TASK_LABEL] == "1"
    # It starts as root only in the entrypoint that confines its network and drops to uid 1000 with no capability
    # in any set (tests/test_hostile_docker.py checks every process inside); that entrypoint holds these four.
    assert container.attrs["Config"]["Entrypoint"] == ["/usr/local/bin/confine-sandbox", backend.peer_address()]
    assert config["CapDrop"] == ["ALL"]
    assert sorted(cap.removeprefix("CAP_") for cap in config["CapAdd"]) == ["NET_ADMIN", "SETGID", "SETPCAP", "SETUID"]
    assert config["SecurityOpt"] == ["no-new-privileges"]
    status = container.exec_run(["cat", "/proc/1/status"], user="1000").output.decode()
    assert "Uid:\t1000\t1000\t1000\t1000" in status and "CapBnd:\t0000000000000000" in status
    assert config["Memory"] == 2048 * 2**20
    assert list(container.attrs["NetworkSettings"]["Networks"]) == [backend.network]
    assert docker.from_env().networks.get(backend.network).attrs["Internal"] is True
    env_names = {item.split("=", 1)[0] for item in container.attrs["Config"]["Env"]}
    assert "KG_AUTH_TOKEN" in env_names
    assert not any("KEY" in name and name != "KG_AUTH_TOKEN" for name in env_names)


def test_kernel_keeps_state_between_cells_and_reports_errors(kernel: KernelClient) -> None:
    execution, output = kernel.execute("import os\nx = 41\nprint(os.getcwd())", timeout_s=30)
    assert execution.ok and output.items[0].text == "/workspace\n"
    execution, output = kernel.execute("x + 1", timeout_s=30)
    assert output.items[-1].kind == "result" and output.items[-1].text == "42"
    execution, _ = kernel.execute("1 / 0", timeout_s=30)
    assert execution.error_name == "ZeroDivisionError" and execution.error_value == "division by zero"


def test_scientific_stack_and_plots_work(kernel: KernelClient) -> None:
    code = (
        "import pandas as pd, numpy as np, matplotlib.pyplot as plt, os\n"
        "os.makedirs('./output', exist_ok=True)\n"
        "plt.plot(np.arange(3)); plt.savefig('./output/p.png')\n"
        "print(pd.DataFrame({'a': [1, 2]}).a.sum())"
    )
    execution, output = kernel.execute(code, timeout_s=120)
    assert execution.ok, output.items
    assert [item.text for item in output.items if item.kind == "stream"] == ["3\n"]
    # The inline backend shows the open figure at the end of the cell, as PyBench's notebook harness does.
    assert output.items[-1].kind == "display" and len(output.images) == 1


def test_files_go_in_and_come_out(backend: DockerSandboxBackend, sandbox: SandboxHandle, kernel: KernelClient) -> None:
    backend.put_file(sandbox, "/workspace/data/in.csv", b"a,b\n1,2\n")
    execution, output = kernel.execute(
        "import pandas as pd\ndf = pd.read_csv('./data/in.csv')\ndf.to_csv('./output/out.csv', index=False)\n"
        "import os; os.makedirs('./output/sub', exist_ok=True); open('./output/sub/t.txt', 'w').write('hi')",
        timeout_s=60,
    )
    assert execution.ok, output.items
    files = backend.get_tree(sandbox, "/workspace/output").files
    assert files == {"out.csv": b"a,b\n1,2\n", "sub/t.txt": b"hi"}
    assert backend.get_tree(sandbox, "/workspace/nothing-here").files == {}


def test_a_cell_past_its_timeout_is_interrupted(kernel: KernelClient) -> None:
    execution, _ = kernel.execute("import time\ntime.sleep(60)", timeout_s=1)
    assert execution.timed_out and execution.duration_s < 15
    execution, output = kernel.execute("print('still alive')", timeout_s=10)
    assert execution.ok and output.items[0].text == "still alive\n"


def test_stop_removes_the_container_and_a_stopped_sandbox_is_unavailable(backend: DockerSandboxBackend) -> None:
    handle = backend.start(SandboxSpec(evaluation_id="test-sandbox", task_index=2, attempt=1, image=SANDBOX_IMAGE))
    backend.stop(handle)
    with pytest.raises(docker.errors.NotFound):
        docker.from_env().containers.get(handle.sandbox_id)
    with pytest.raises(SandboxUnavailableError):
        backend.put_file(handle, "/workspace/data/x", b"x")
    backend.stop(handle)  # a second stop is harmless


def test_a_missing_image_is_a_start_error_that_says_how_to_build(backend: DockerSandboxBackend) -> None:
    spec = SandboxSpec(evaluation_id="test-sandbox", task_index=3, attempt=1, image="pybench-eval/no-such:image")
    with pytest.raises(SandboxStartError, match="make images"):
        backend.start(spec)


def test_cell_round_trip_costs_milliseconds(kernel: KernelClient) -> None:
    """Not a timed assertion of speed targets (those are benchmarks): a guard against Nagle's 40 ms stalls."""
    kernel.execute("pass", timeout_s=10)
    samples = []
    for _ in range(30):
        started = time.perf_counter()
        kernel.execute("1", timeout_s=10)
        samples.append(time.perf_counter() - started)
    median_ms = statistics.median(samples) * 1000
    print(f"median cell round trip through the sandbox: {median_ms:.1f} ms")
    assert median_ms < 35, f"median round trip {median_ms:.1f} ms: is TCP_NODELAY set on both sides?"


def test_each_cell_reports_the_sandbox_cpu_time_and_peak_memory(kernel: KernelClient) -> None:
    execution, _ = kernel.execute(
        "import time\nx = bytearray(300 * 2**20)\nend = time.process_time() + 0.5\n"
        "while time.process_time() < end:\n    pass\ndel x",
        timeout_s=60,
    )
    assert execution.telemetry_scope == "cgroup"
    assert execution.cpu_s is not None and 0.4 <= execution.cpu_s < 5
    assert execution.peak_memory_mb is not None and execution.peak_memory_mb >= 300
    quiet, _ = kernel.execute("1", timeout_s=10)
    assert quiet.cpu_s is not None and quiet.cpu_s < 0.2
    assert quiet.peak_memory_mb is not None and quiet.peak_memory_mb < execution.peak_memory_mb - 200
    # The probe leaves nothing in the model's namespace, and a restart reinstalls it.
    names, _ = kernel.execute("print(sorted(n for n in dir() if not n.startswith('_')))", timeout_s=10)
    assert "probe" not in names.output and "snapshot" not in names.output
    restarted, _ = kernel.execute("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", timeout_s=30)
    assert restarted.kernel_restarted and restarted.cpu_s is None
    after, _ = kernel.execute("2", timeout_s=30)
    assert after.ok and after.peak_memory_mb is not None


def test_a_displayed_chart_is_kept_as_png(kernel: KernelClient) -> None:
    execution, output = kernel.execute(
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()", timeout_s=120
    )
    assert execution.ok, output.items
    assert len(output.images) == 1
    assert base64.b64decode(output.images[0]).startswith(b"\x89PNG")


def test_cells_that_try_the_network_fail_at_once_with_an_error_the_model_can_read(kernel: KernelClient) -> None:
    # the resolver is out of reach (no loopback route but 127.0.0.1's): a lookup fails at once, not after the
    # resolver's timeouts (10 s a name before), and pip, asked for a package the image lacks, gives up in seconds
    started = time.monotonic()
    execution, output = kernel.execute(
        "import socket\ntry:\n    socket.getaddrinfo('pypi.org', 443)\nexcept OSError as exc:\n    print(repr(exc))",
        timeout_s=30,
    )
    assert execution.ok and "gaierror" in output.items[0].text
    assert time.monotonic() - started < 1.0
    started = time.monotonic()
    execution, output = kernel.execute("!pip install pbe-no-such-package-here", timeout_s=60)
    assert "No matching distribution" in "".join(item.text for item in output.items)
    assert time.monotonic() - started < 5.0
