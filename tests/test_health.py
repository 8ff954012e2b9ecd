"""The containers' health checks (``services/observability/health.py``), run as compose runs them: ``python3 -I -S``
on the file,
against a real Redis (with and without a password), the real Docker engine and a real HTTP server on loopback."""

import http.server
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.servers import free_port

ROOT = Path(__file__).resolve().parent.parent
HEALTH = ROOT / "services" / "observability" / "health.py"


def check(
    *targets: str, redis_url: str | None = None, docker_host: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"]}
    if redis_url is not None:
        env["PBE_REDIS_URL"] = redis_url
    if docker_host is not None:
        env["DOCKER_HOST"] = docker_host
    return subprocess.run(
        [sys.executable, "-I", "-S", str(HEALTH), *targets], env=env, capture_output=True, text=True, timeout=30
    )


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200 if self.path == "/health" else 503)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def http_url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture()
def password_redis(tmp_path: Path) -> Iterator[str]:
    binary = shutil.which("redis-server")
    assert binary is not None, "redis-server is missing: apt-get install redis-server"
    port = free_port()
    process = subprocess.Popen(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--requirepass", "s3cret w0rd",
         "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while check("redis", redis_url=f"redis://:s3cret%20w0rd@127.0.0.1:{port}/0").returncode != 0:
        assert time.monotonic() < deadline and process.poll() is None, "redis-server did not start"
        time.sleep(0.05)
    yield f"127.0.0.1:{port}"
    process.kill()
    process.wait(timeout=10)


def test_redis_answers_and_a_closed_port_does_not(redis_url: str) -> None:
    assert check("redis", redis_url=redis_url).returncode == 0
    closed = check("redis", redis_url=f"redis://127.0.0.1:{free_port()}/0")
    assert closed.returncode == 1 and "unhealthy: redis:" in closed.stderr


def test_redis_with_a_password(password_redis: str) -> None:
    assert check("redis", redis_url=f"redis://:s3cret%20w0rd@{password_redis}/0").returncode == 0
    wrong = check("redis", redis_url=f"redis://:wrong@{password_redis}/0")
    assert wrong.returncode == 1 and "WRONGPASS" in wrong.stderr
    missing = check("redis", redis_url=f"redis://{password_redis}/0")
    assert missing.returncode == 1 and "NOAUTH" in missing.stderr


def test_an_http_endpoint_answers_2xx_or_is_unhealthy(http_url: str) -> None:
    assert check(f"{http_url}/health").returncode == 0
    failing = check(f"{http_url}/other")
    assert failing.returncode == 1 and "HTTP 503" in failing.stderr
    closed = check(f"http://127.0.0.1:{free_port()}/health")
    assert closed.returncode == 1


@pytest.mark.docker
def test_the_docker_engine_answers_on_its_socket(redis_url: str) -> None:
    assert check("redis", "docker", redis_url=redis_url).returncode == 0
    gone = check("docker", docker_host="unix:///nonexistent/docker.sock")
    assert gone.returncode == 1 and "unhealthy: docker:" in gone.stderr


def test_unknown_targets_and_no_target_are_refused() -> None:
    unknown = check("mysql")
    assert unknown.returncode == 1 and "unknown target 'mysql'" in unknown.stderr
    assert check().returncode == 2


def test_the_check_needs_nothing_but_the_standard_library() -> None:
    # -I -S: no site-packages and no project package on the path; the check imports only the standard library.
    probe = subprocess.run(
        [sys.executable, "-I", "-S", "-c",
         f"import runpy, sys; runpy.run_path({str(HEALTH)!r}, run_name='health'); "
         "print(sorted(m for m in sys.modules if m.split('.')[0] in ('redis', 'docker', 'services', 'httpx')))"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert probe.stdout.strip() == "[]"


def test_compose_and_kubernetes_run_this_check() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    for service in ("executor", "grader"):
        assert compose[service]["healthcheck"]["test"][1:] == [
            "python3", "-I", "-S", "/app/services/observability/health.py", "redis", "docker"
        ]  # fmt: skip
    for name in ("executor", "grader"):
        manifest = yaml.safe_load_all((ROOT / "k8s" / "base" / f"{name}.yaml").read_text())
        probes = [
            container["readinessProbe"]["exec"]["command"]
            for document in manifest
            if document and document.get("kind") == "Deployment"
            for container in document["spec"]["template"]["spec"]["containers"]
        ]
        assert probes == [["python3", "-I", "-S", "/app/services/observability/health.py", "redis"]]


def _seconds(duration: str) -> float:
    """A compose duration of the form the file uses (``30s``, ``2m``, ``1m30s``) in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0}
    total, number = 0.0, ""
    for char in duration:
        if char.isdigit() or char == ".":
            number += char
        else:
            total, number = total + float(number) * units[char], ""
    assert number == "", f"duration {duration!r} has no unit"
    return total


def test_the_stacks_checks_are_sparse() -> None:
    # Each check is an exec the engine pays for: every 30 s or less often, except Redis's, which the services
    # wait on to start, at most one every 5 s.
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    for service in ("gateway", "executor", "grader", "replay"):
        health = compose[service]["healthcheck"]
        assert _seconds(health["interval"]) >= 30, service
        assert _seconds(health["start_period"]) >= _seconds(health["interval"]), service
    assert _seconds(compose["redis"]["healthcheck"]["interval"]) >= 5
    assert _seconds("1m30s") == 90
