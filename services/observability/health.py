"""The containers' health checks: is Redis answering, the Docker engine, an HTTP endpoint? Standard library only.

Compose runs a service's check every few seconds for as long as the stack is up, as a process of its own in the
service's container, and the engine pays for each too (an exec). A check that imported the docker and redis
clients cost about 0.3 CPU-seconds; with four workers checked every 5 s that was about 0.25 of a core all the time,
a quarter of what a replay of the whole suite spent outside its cells. This one speaks the three protocols itself
(``PING`` to Redis, ``GET /_ping`` to the engine's socket, a ``GET`` over HTTP) and is run as a file with
``python3 -I -S`` (no site-packages, no project package imported), which costs a few milliseconds.

Usage: ``python3 -I -S /app/services/observability/health.py redis [docker] [http://127.0.0.1:8080/health]``.
``redis`` reads
``PBE_REDIS_URL`` (``redis://[:password@]host[:port][/db]``; ``rediss://`` over TLS), ``docker`` reads
``DOCKER_HOST`` (``unix://`` or ``tcp://``, default the local socket). Exits 0 when every target answered, else 1
with one line per failure on stderr naming what did not answer.
"""

import http.client
import os
import socket
import sys
from urllib.parse import unquote, urlsplit

DEFAULT_TIMEOUT_S = 3.0
"""How long each target may take to answer."""

DEFAULT_DOCKER_SOCKET = "/var/run/docker.sock"
"""The engine's socket when ``DOCKER_HOST`` is not set."""


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket (the Docker engine's API)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def check_redis(url: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Send ``PING`` (after ``AUTH`` when the URL has a password) and expect ``+PONG``.

    Raises:
        OSError: no connection, no answer in time, or not the answer of a Redis that is up.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        raise OSError(f"PBE_REDIS_URL must be redis:// or rediss://, not {url.split(':', 1)[0]!r}")
    commands = b""
    if parts.password:
        user = unquote(parts.username) if parts.username else None
        words = ["AUTH", *([user] if user else []), unquote(parts.password)]
        commands += b"".join(_resp_array(words))
    commands += b"*1\r\n$4\r\nPING\r\n"
    with socket.create_connection((parts.hostname or "localhost", parts.port or 6379), timeout=timeout_s) as raw:
        conn: socket.socket = raw
        if parts.scheme == "rediss":
            import ssl

            conn = ssl.create_default_context().wrap_socket(raw, server_hostname=parts.hostname)
        conn.sendall(commands)
        answer = b""
        while b"PONG" not in answer and not answer.startswith(b"-"):
            chunk = conn.recv(256)
            if not chunk:
                break
            answer += chunk
    if b"+PONG" not in answer:
        raise OSError(f"Redis answered {answer[:80]!r} to PING")


def _resp_array(words: list[str]) -> list[bytes]:
    encoded = [word.encode() for word in words]
    return [f"*{len(encoded)}\r\n".encode(), *(b"$%d\r\n%s\r\n" % (len(word), word) for word in encoded)]


def check_http(url: str, timeout_s: float = DEFAULT_TIMEOUT_S, *, unix_socket: str | None = None) -> None:
    """``GET`` the URL (over ``unix_socket`` when given) and expect a 2xx answer.

    Raises:
        OSError: no connection, no answer in time, or another status.
    """
    parts = urlsplit(url)
    conn: http.client.HTTPConnection
    if unix_socket is not None:
        conn = _UnixConnection(unix_socket, timeout_s)
    elif parts.scheme == "https":
        conn = http.client.HTTPSConnection(parts.hostname or "localhost", parts.port, timeout=timeout_s)
    else:
        conn = http.client.HTTPConnection(parts.hostname or "localhost", parts.port, timeout=timeout_s)
    try:
        conn.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
        status = conn.getresponse().status
    except http.client.HTTPException as exc:
        raise OSError(f"{url} gave no HTTP answer: {exc}") from exc
    finally:
        conn.close()
    if not 200 <= status < 300:
        raise OSError(f"{url} answered HTTP {status}")


def check_docker(docker_host: str | None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Ask the engine's ``/_ping``.

    Raises:
        OSError: the engine did not answer OK.
    """
    host = docker_host or f"unix://{DEFAULT_DOCKER_SOCKET}"
    if host.startswith("unix://"):
        check_http("http://localhost/_ping", timeout_s, unix_socket=host[len("unix://") :])
    elif host.startswith("tcp://"):
        check_http("http://" + host[len("tcp://") :] + "/_ping", timeout_s)
    else:
        raise OSError(f"DOCKER_HOST must be unix:// or tcp://, not {host!r}")


def main(targets: list[str]) -> int:
    """Check every target (``redis``, ``docker`` or an ``http(s)://`` URL); 0 when all answered, else 1."""
    if not targets:
        print("name what to check: redis, docker, or an http:// URL", file=sys.stderr)
        return 2
    failed = 0
    for target in targets:
        try:
            if target == "redis":
                check_redis(os.environ.get("PBE_REDIS_URL", "redis://localhost:6379/0"))
            elif target == "docker":
                check_docker(os.environ.get("DOCKER_HOST"))
            elif target.startswith(("http://", "https://")):
                check_http(target)
            else:
                raise OSError(f"unknown target {target!r}: redis, docker, or an http:// URL")
        except OSError as exc:
            print(f"unhealthy: {target}: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
