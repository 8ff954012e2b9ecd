"""The local backend's own cases: start failures leave nothing behind, sandbox paths stay in the workspace,
symbolic links are never followed, and stop finds the processes the code left."""

import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from executor.kernel import KernelClient, shaped
from executor.output import CellOutput
from executor.settings import ExecutorSettings
from services.errors import SandboxError, SandboxStartError, SandboxUnavailableError
from services.sandbox.base import TREES_AT_ONCE, SandboxSpec, Tree
from services.sandbox.contract import SandboxHandle
from services.sandbox.local import DEFAULT_GATEWAY_COMMAND, LocalSandboxBackend
from services.sandbox.registry import get_backend


def spec(evaluation_id: str = "local-test", ready_timeout_s: float = 60.0) -> SandboxSpec:
    return SandboxSpec(
        evaluation_id=evaluation_id, task_index=1, attempt=1, image="local", ready_timeout_s=ready_timeout_s
    )


def folder_of(handle: SandboxHandle) -> Path:
    return Path(handle.sandbox_id.partition(":")[2])


def running(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("local-root")


@pytest.fixture(scope="module")
def backend(root: Path) -> Iterator[LocalSandboxBackend]:
    backend = LocalSandboxBackend(root=root)
    yield backend
    backend.reap()


@pytest.fixture(scope="module")
def sandbox(backend: LocalSandboxBackend) -> Iterator[SandboxHandle]:
    handle = backend.start(spec())
    yield handle
    backend.stop(handle)


# --- start failures -------------------------------------------------------------------------------------


def test_a_gateway_that_exits_at_once_is_a_start_error_with_its_log_and_leaves_nothing(tmp_path: Path) -> None:
    backend = LocalSandboxBackend(
        root=tmp_path,
        gateway_command=[sys.executable, "-c", "import sys; print('gateway says no', file=sys.stderr); sys.exit(3)"],
    )
    with pytest.raises(SandboxStartError, match=r"(?s)status 3.*gateway says no"):
        backend.start(spec())
    assert list(tmp_path.iterdir()) == []


def test_a_missing_gateway_program_is_a_start_error_and_leaves_nothing(tmp_path: Path) -> None:
    backend = LocalSandboxBackend(root=tmp_path, gateway_command=[str(tmp_path / "no-such-python")])
    with pytest.raises(SandboxStartError, match="cannot start a local sandbox"):
        backend.start(spec())
    assert list(tmp_path.iterdir()) == []


def test_a_configuration_file_that_fails_is_a_start_error(tmp_path: Path) -> None:
    config = tmp_path / "broken_config.py"
    config.write_text("raise RuntimeError('this configuration is broken')\n")
    root = tmp_path / "root"
    backend = LocalSandboxBackend(root=root, config_file=config)
    with pytest.raises(SandboxStartError, match=r"(?s)could not load its configuration.*this configuration is broken"):
        backend.start(spec())
    assert list(root.iterdir()) == []


def test_a_gateway_that_never_answers_is_killed_and_removed(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    root = tmp_path / "root"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    backend = LocalSandboxBackend(root=root, gateway_command=[sys.executable, "-c", code])
    started = time.monotonic()
    with pytest.raises(SandboxStartError, match="did not answer within 2 s"):
        backend.start(spec(ready_timeout_s=2))
    assert time.monotonic() - started < 15
    assert not running(int(pid_file.read_text()))
    assert list(root.iterdir()) == []


# --- what the gateway and the kernel get ------------------------------------------------------------------


def test_the_gateway_gets_a_few_variables_not_the_executors(
    monkeypatch: pytest.MonkeyPatch, backend: LocalSandboxBackend
) -> None:
    monkeypatch.setenv("PBE_CANARY_SECRET", "do-not-pass")
    handle = backend.start(spec(evaluation_id=f"local-{uuid.uuid4().hex[:8]}"))
    try:
        environment = psutil.Process(int(handle.sandbox_id.partition(":")[0])).environ()
        assert set(environment) <= {
            "PATH",
            "HOME",
            "LANG",
            "MPLBACKEND",
            "PYTHONUNBUFFERED",
            "JUPYTER_RUNTIME_DIR",
            "KG_AUTH_TOKEN",
        }
        assert environment["HOME"] == str(folder_of(handle) / "home")
        assert environment["KG_AUTH_TOKEN"] == handle.token
        meta = (folder_of(handle) / "meta" / "sandbox.json").read_text()
        assert handle.name in meta and handle.token not in meta
    finally:
        backend.stop(handle)


def test_stop_kills_what_the_kernel_left_running_even_in_a_session_of_its_own(backend: LocalSandboxBackend) -> None:
    handle = backend.start(spec(evaluation_id=f"local-{uuid.uuid4().hex[:8]}"))
    kernel = KernelClient(handle.url, handle.token)
    try:
        kernel.start()
        execution, output = kernel.execute(
            "import subprocess, sys\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True)\n"
            "print(child.pid)",
            timeout_s=60,
        )
        assert execution.ok, output.items
        pid = int(output.items[0].text)
        assert running(pid)
    finally:
        kernel.close()
        backend.stop(handle)
    assert not running(pid)
    assert not folder_of(handle).exists()


# --- sandbox paths ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dest",
    [
        "/etc/pbe-probe",
        "/workspace/../pbe-probe",
        "/workspace/data/../../pbe-probe",
        "/workspacex/pbe-probe",
        "workspace/data/pbe-probe",
        "/workspace",
        "/workspace/",
        "/workspace/data/\0x",
    ],
)
def test_put_file_refuses_a_path_outside_the_workspace(
    backend: LocalSandboxBackend, sandbox: SandboxHandle, dest: str
) -> None:
    with pytest.raises(SandboxError, match="/workspace") as raised:
        backend.put_file(sandbox, dest, b"x")
    assert not isinstance(raised.value, SandboxUnavailableError)
    assert not (folder_of(sandbox) / "pbe-probe").exists()
    assert not Path("/etc/pbe-probe").exists()


def test_get_tree_refuses_a_path_outside_the_workspace(backend: LocalSandboxBackend, sandbox: SandboxHandle) -> None:
    with pytest.raises(SandboxError, match="outside /workspace"):
        backend.get_tree(sandbox, "/etc")
    with pytest.raises(SandboxError, match="climbs"):
        backend.get_tree(sandbox, "/workspace/..")


def test_put_file_never_writes_through_a_link(
    backend: LocalSandboxBackend, sandbox: SandboxHandle, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("untouched")
    data = folder_of(sandbox) / "workspace" / "data"
    (data / "linked-folder").symlink_to(outside)
    (data / "linked-file").symlink_to(outside / "victim.txt")
    with pytest.raises(SandboxError, match="symbolic link"):
        backend.put_file(sandbox, "/workspace/data/linked-folder/new.txt", b"x")
    with pytest.raises(SandboxError, match="symbolic link"):
        backend.put_file(sandbox, "/workspace/data/linked-file", b"overwritten")
    assert sorted(os.listdir(outside)) == ["victim.txt"]
    assert (outside / "victim.txt").read_text() == "untouched"


def test_get_tree_does_not_follow_a_linked_folder(
    backend: LocalSandboxBackend, sandbox: SandboxHandle, tmp_path: Path
) -> None:
    outside = tmp_path / "secrets"
    outside.mkdir()
    (outside / "key").write_text("secret")
    (folder_of(sandbox) / "workspace" / "linked-output").symlink_to(outside)
    assert backend.get_tree(sandbox, "/workspace/linked-output").files == {}
    assert backend.get_tree(sandbox, "/workspace/linked-output/").files == {}


def test_a_forged_handle_touches_nothing(backend: LocalSandboxBackend, sandbox: SandboxHandle, tmp_path: Path) -> None:
    decoy = tmp_path / "pbe-local-decoy"
    (decoy / "meta").mkdir(parents=True)
    (decoy / "meta" / "sandbox.json").write_text('{"name": "someone-else"}')
    forged = sandbox.model_copy(update={"sandbox_id": f"1:{decoy}"})
    backend.stop(forged)
    assert (decoy / "meta" / "sandbox.json").exists()
    with pytest.raises(SandboxUnavailableError):
        backend.get_tree(forged, "/workspace")
    backend.stop(sandbox.model_copy(update={"sandbox_id": "not-a-local-id"}))
    assert folder_of(sandbox).exists()


def test_the_registry_builds_the_local_backend_under_the_configured_root(tmp_path: Path) -> None:
    backend = get_backend(ExecutorSettings(SANDBOX_BACKEND="local", SANDBOX_LOCAL_ROOT=str(tmp_path)))
    assert isinstance(backend, LocalSandboxBackend)
    assert backend.root == tmp_path.resolve()


def test_a_cell_past_its_timeout_is_cut_even_while_the_gateway_keeps_pinging(root: Path) -> None:
    """The gateway pings its websockets (every 30 s as shipped, every second here): pings must not hold a
    read past the cell's deadline, or a cell that never prints runs on for as long as the pings come."""
    pinging = LocalSandboxBackend(
        root=root, gateway_command=[*DEFAULT_GATEWAY_COMMAND, "--KernelGatewayApp.ws_ping_interval=1"]
    )
    handle = pinging.start(spec(evaluation_id=f"local-{uuid.uuid4().hex[:8]}"))
    kernel = KernelClient(handle.url, handle.token, probe_scope=None)
    try:
        kernel.start()
        started = time.monotonic()
        execution, _ = kernel.execute("import time\nwhile True:\n    time.sleep(0.05)", timeout_s=3)
        elapsed = time.monotonic() - started
        assert execution.timed_out and execution.interrupted
        assert elapsed < 3 + 5, f"the cell was cut after {elapsed:.1f} s, its timeout was 3 s"
    finally:
        kernel.close()
        pinging.stop(handle)


class _CountingBackend(LocalSandboxBackend):
    """The local backend, counting the folders it reads at once (each read made to last 0.2 s)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root=root)
        self.reading = self.most = 0
        self.caps: list[dict[str, int]] = []
        self._count = threading.Lock()

    def get_tree(self, handle: SandboxHandle, path: str, **caps: int) -> Tree:
        with self._count:
            self.reading += 1
            self.most = max(self.most, self.reading)
            self.caps.append(caps)
        try:
            time.sleep(0.2)
            return super().get_tree(handle, path, **caps)
        finally:
            with self._count:
                self.reading -= 1


def test_sessions_that_end_together_collect_their_output_a_few_at_a_time(
    backend: LocalSandboxBackend, sandbox: SandboxHandle, root: Path
) -> None:
    """Twelve collections at once hold at most TREES_AT_ONCE folders, each within the default caps (64 MiB)."""
    backend.put_file(sandbox, "/workspace/output/a.txt", b"a")
    counting = _CountingBackend(root)
    with ThreadPoolExecutor(max_workers=12) as pool:
        trees = list(pool.map(lambda _: counting.collect_tree(sandbox, "/workspace/output"), range(12)))
    assert all(tree.files == {"a.txt": b"a"} for tree in trees)
    assert counting.most == TREES_AT_ONCE
    assert counting.caps == [{}] * 12, "a collection reads with caps of its own, not the default ones"


ODD_MESSAGES = """
from ipykernel.kernelbase import Kernel
kernel = get_ipython().kernel
parent = kernel.get_parent()
for msg_type, content in [
    ("display_data", {"data": "text, not an object", "metadata": []}),
    ("execute_result", {"data": {"text/plain": 7, "image/png": ["not", "text"]}, "execution_count": "x"}),
    ("stream", {"name": ["stdout"], "text": {"not": "text"}}),
    ("error", {"ename": None, "evalue": 3, "traceback": "not a list"}),
    ("status", {"execution_state": {"idle": True}}),
    ("display_data", "content that is not an object"),
]:
    kernel.session.send(kernel.iopub_socket, msg_type, content, parent=parent)
print("after the odd messages")
"""


def test_odd_kernel_messages_sent_by_the_models_code_end_nothing(backend: LocalSandboxBackend) -> None:
    """The model's code may send any message on the kernel's channels; the client shapes each before reading it,
    so the cell ends normally with what could be read, and the next cell runs."""
    handle = backend.start(spec(evaluation_id=f"local-{uuid.uuid4().hex[:8]}"))
    kernel = KernelClient(handle.url, handle.token)
    try:
        kernel.start()
        execution, output = kernel.execute(ODD_MESSAGES, timeout_s=60)
        assert "after the odd messages" in "".join(item.text for item in output.items)
        assert not execution.timed_out
        again, more = kernel.execute("print(6 * 7)", timeout_s=60)
        assert again.ok and more.items[-1].text.strip() == "42"
    finally:
        kernel.close()
        backend.stop(handle)


@pytest.mark.parametrize(
    "message",
    [
        None,
        [],
        {"header": "x", "parent_header": 5, "content": [], "msg_type": 3},
        {"msg_type": "display_data", "content": {"data": "text"}},
        {"msg_type": "error", "content": {"traceback": [1, "line", None], "ename": 2}},
        {"header": {"msg_type": "stream"}, "content": {"text": b"bytes", "name": None}},
    ],
)
def test_shaped_gives_the_types_the_client_reads(message: object) -> None:
    result = shaped(message)
    assert isinstance(result["header"], dict) and isinstance(result["parent_header"], dict)
    assert isinstance(result["content"], dict) and isinstance(result["msg_type"], str)
    output = CellOutput()
    output.add(result["msg_type"], result["content"])  # reads every field it knows without an error
