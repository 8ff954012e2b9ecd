"""The egress guard (services.endpoint.netguard): URL checks, the allowlist, and the pinned transport.

Nothing here leaves the machine. An autouse fixture replaces ``socket.getaddrinfo`` and ``socket.socket.connect``
so that a real lookup of any name but loopback literals (and the names a test maps to loopback), or a connection
to any address but loopback, fails the test. Names resolve through ``FakeResolver``; refused and public
addresses are only ever handed to a recording transport; real connections go to HTTP(S) servers on 127.0.0.x.
"""

import ipaddress
import json
import socket
import ssl
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from socketserver import TCPServer
from typing import Any

import httpx
import pytest

from gateway.egress import check_url_field
from gateway.problems import Problem
from services.endpoint.netguard import (
    ALLOWLIST_SETTING,
    EgressPolicy,
    EgressRefusedError,
    PinnedTransport,
    UnresolvableHostError,
    address_refusal,
    check_url,
    pinned_transport,
    resolve_host,
)
from tests.fixtures import gateway_settings

CORPUS = Path(__file__).with_name("hostile_urls.txt")

FAKE_DNS: dict[str, list[str]] = {
    # public
    "api.openai.com": ["8.8.8.8"],
    "public.example": ["1.1.1.1"],
    "dual.example": ["1.1.1.1", "2606:4700:4700::1111"],
    "xn--bcher-kva.de": ["8.8.4.4"],
    "v6only.example": ["64:ff9b::808:808"],
    "mapped-public.example": ["::ffff:8.8.8.8"],
    # internal
    "internal.example": ["10.0.0.5"],
    "metadata.google.internal": ["169.254.169.254"],
    "10.0.0.1.nip.io": ["10.0.0.1"],
    "mixed.example": ["8.8.8.8", "127.0.0.1"],
    "mixed6.example": ["1.1.1.1", "2606:4700:4700::1111", "::1"],
    "ula.example": ["fd12:3456::1"],
    "linklocal6.example": ["fe80::1"],
    "mapped.example": ["::ffff:169.254.169.254"],
    "nat64.example": ["64:ff9b::a00:1"],
    "cgnat.example": ["100.64.0.1"],
    "multicast.example": ["224.0.0.251"],
    "broadcast.example": ["255.255.255.255"],
    "zero.example": ["0.0.0.0"],
    "sixtofour.example": ["2002:a00:1::1"],
    "teredo.example": ["2001:0:4136:e378:8000:63bf:3fff:fdd2"],
    "scoped.example": ["fe80::1%2"],
    "garbage.example": ["not-an-ip"],
    "xn--bcher-kva.internal.example": ["192.168.1.1"],
    "xn--loclhost-36g": ["127.0.0.1"],
    # operator-allowed services
    "replay": ["172.18.0.5"],
    "vllm.models.svc.cluster.local": ["10.96.0.10"],
    "evilsvc.cluster.local": ["10.96.0.11"],
    "svc.cluster.local": ["10.96.0.12"],
}
"""What the fake resolver answers; every other name does not resolve."""

GOOD_URLS: list[tuple[str, list[str]]] = [
    ("https://api.openai.com/v1", ["8.8.8.8"]),
    ("http://api.openai.com:8000/v1", ["8.8.8.8"]),
    ("https://API.OpenAI.com/v1?api-version=2024-10-21#top", ["8.8.8.8"]),
    ("https://api.openai.com./v1", ["8.8.8.8"]),
    ("https://dual.example/v1", ["1.1.1.1", "2606:4700:4700::1111"]),
    ("https://bücher.de/v1", ["8.8.4.4"]),
    ("https://v6only.example/v1", ["64:ff9b::808:808"]),
    ("https://mapped-public.example/v1", ["::ffff:808:808"]),
    ("http://8.8.8.8:8000/v1", ["8.8.8.8"]),
    ("https://[2606:4700:4700::1111]/v1", ["2606:4700:4700::1111"]),
    ("https://[64:ff9b::101:101]/v1", ["64:ff9b::101:101"]),
]
"""URLs that pass the check with an empty policy, and the addresses they are checked at (never connected to)."""


def load_corpus() -> list[tuple[str, str]]:
    cases = []
    for line in CORPUS.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        url, _, fragment = line.rpartition(" | ")
        cases.append((url, fragment))
    return cases


HOSTILE = load_corpus()


# --- test doubles ---------------------------------------------------------------------------------------------


@dataclass
class FakeResolver:
    """Answers from a table (or, per name, a list of successive answers) and records every lookup."""

    table: dict[str, list[str]] = field(default_factory=lambda: dict(FAKE_DNS))
    sequences: dict[str, list[list[str]]] = field(default_factory=dict)
    lookups: list[tuple[str, int]] = field(default_factory=list)

    def __call__(self, host: str, port: int) -> list[str]:
        self.lookups.append((host, port))
        name = host.lower().removesuffix(".")
        if name in self.sequences:
            answers = self.sequences[name]
            return answers.pop(0) if len(answers) > 1 else answers[0]
        if name in self.table:
            return list(self.table[name])
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


class RecordingTransport(httpx.BaseTransport):
    """Records what it is asked to send and answers 200 without touching the network."""

    def __init__(self, fail_for: Iterable[str] = ()) -> None:
        self.requests: list[httpx.Request] = []
        self.fail_for = set(fail_for)
        self.closed = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.host in self.fail_for:
            raise httpx.ConnectError("connection refused (recorded)", request=request)
        return httpx.Response(200, json={"ok": True})

    def close(self) -> None:
        self.closed = True


@dataclass
class MachineNetwork:
    """The real lookups and connections the tests made (all loopback, or the guard fails the test)."""

    names: dict[str, str] = field(default_factory=dict)
    """Names that the patched getaddrinfo maps to a loopback address (for the naive-client contrast)."""
    lookups: list[str] = field(default_factory=list)
    connections: list[str] = field(default_factory=list)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


@pytest.fixture(autouse=True)
def machine_network(monkeypatch: pytest.MonkeyPatch) -> MachineNetwork:
    """Fail any real DNS lookup or connection that would leave this machine."""
    network = MachineNetwork()
    real_getaddrinfo = socket.getaddrinfo
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        network.lookups.append(str(name))
        if name in network.names:
            host = network.names[name]
        elif name is not None and not _is_loopback(name):
            raise AssertionError(f"a test tried a real DNS lookup of {name!r}")
        return real_getaddrinfo(host, port, *args, **kwargs)

    def check(sock: socket.socket, address: Any) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            if not _is_loopback(str(address[0])):
                raise AssertionError(f"a test tried to connect to {address[0]}")
            network.connections.append(str(address[0]))

    def connect(self: socket.socket, address: Any) -> None:
        check(self, address)
        real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        check(self, address)
        return real_connect_ex(self, address)

    def no_lookup(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a test tried a real DNS lookup {args!r}")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket, "gethostbyname", no_lookup)
    monkeypatch.setattr(socket, "gethostbyname_ex", no_lookup)
    monkeypatch.setattr(socket, "gethostbyaddr", no_lookup)
    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    return network


# --- real loopback servers ------------------------------------------------------------------------------------


class RecordingServer(ThreadingHTTPServer):
    """An HTTP(S) server on a loopback address that records connections, TLS server names and requests."""

    daemon_threads = True

    def __init__(self, host: str, port: int = 0, tls: ssl.SSLContext | None = None) -> None:
        if ":" in host:
            self.address_family = socket.AF_INET6
        self.connections = 0
        self.server_names: list[str | None] = []
        self.requests: list[dict[str, str]] = []
        super().__init__((host, port), RecordingHandler)
        if tls is not None:
            tls.sni_callback = self._sni
            self.socket = tls.wrap_socket(self.socket, server_side=True)

    def server_bind(self) -> None:
        TCPServer.server_bind(self)  # HTTPServer's would look up this address's name (a reverse DNS query)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def get_request(self) -> tuple[socket.socket, Any]:
        request = super().get_request()  # with TLS, the handshake happens here
        self.connections += 1
        return request

    def _sni(self, sock: Any, name: str | None, context: ssl.SSLContext) -> None:
        self.server_names.append(name)

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class RecordingHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: RecordingServer

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer()

    def _answer(self) -> None:
        self.server.requests.append({"method": self.command, "path": self.path, "host": self.headers["Host"]})
        body = json.dumps({"choices": [{"message": {"content": "hi"}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def serving(host: str = "127.0.0.1", port: int = 0, tls: ssl.SSLContext | None = None) -> Iterator[RecordingServer]:
    server = RecordingServer(host, port, tls)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@dataclass(frozen=True)
class Certificates:
    client: ssl.SSLContext
    """Trusts only the test CA, verifies host names."""
    server: Callable[[], ssl.SSLContext]
    """A fresh server context with the leaf certificate (for ``model.test`` only, no IP address)."""


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    """A test CA and a server certificate for ``model.test`` (no other name, no IP address)."""
    x509 = pytest.importorskip("cryptography.x509", reason="the TLS tests make certificates with cryptography")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.now(UTC)

    def name(common: str) -> Any:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(name("netguard test CA"))
        .issuer_name(name("netguard test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf_cert = (
        x509.CertificateBuilder()
        .subject_name(name("model.test"))
        .issuer_name(ca_cert.subject)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("model.test")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    folder = tmp_path_factory.mktemp("tls")
    cert_file, key_file = folder / "leaf.pem", folder / "leaf.key"
    cert_file.write_bytes(leaf_cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        leaf_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    client = ssl.create_default_context(cadata=ca_cert.public_bytes(serialization.Encoding.PEM).decode())

    def server() -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        return context

    return Certificates(client=client, server=server)


LOOPBACK_POLICY = EgressPolicy.parse("127.0.0.1")
"""The tests' operator allowlist for the real servers."""


def loopback_resolver(*names: str) -> FakeResolver:
    return FakeResolver(table={name: ["127.0.0.1"] for name in names})


# --- the corpus -----------------------------------------------------------------------------------------------


def test_the_corpus_is_large_enough() -> None:
    assert len(HOSTILE) >= 40
    assert len({url for url, _ in HOSTILE}) == len(HOSTILE)


@pytest.mark.parametrize(("url", "fragment"), HOSTILE, ids=[url for url, _ in HOSTILE])
def test_check_url_refuses_hostile_urls(url: str, fragment: str, machine_network: MachineNetwork) -> None:
    resolver = FakeResolver()
    with pytest.raises(EgressRefusedError) as caught:
        check_url(url, EgressPolicy(), resolver)
    message = str(caught.value)
    assert not isinstance(caught.value, UnresolvableHostError), message
    assert fragment.lower() in message.lower(), message
    for name, _ in resolver.lookups:
        assert name.lower().removesuffix(".") in FAKE_DNS, "only the corpus' fake names are ever looked up"
    assert machine_network.connections == []


HOSTILE_UNTIL_HTTPX_NORMALISES = {
    "http://@public.example/v1": "http://public.example/v1",
    "http://public.example:+443/v1": "http://public.example:443/v1",
    "http://public.example:８０/v1": "http://public.example/v1",
    "http://public.example:/v1": "http://public.example/v1",
}
"""Corpus URLs that an ``httpx.Request`` turns into a plain URL (the strange part is dropped): the transport
sends those, to the checked public address."""


@pytest.mark.parametrize(("url", "fragment"), HOSTILE, ids=[url for url, _ in HOSTILE])
def test_pinned_transport_sends_nothing_for_hostile_urls(url: str, fragment: str) -> None:
    inner = RecordingTransport()
    transport = pinned_transport(EgressPolicy(), FakeResolver(), inner)
    try:
        request = httpx.Request("GET", url)
    except (httpx.InvalidURL, httpx.UnsupportedProtocol, ValueError):
        return  # httpx itself cannot build the request
    if url in HOSTILE_UNTIL_HTTPX_NORMALISES:
        assert str(request.url) == HOSTILE_UNTIL_HTTPX_NORMALISES[url]
        transport.handle_request(request)
        assert [r.url.host for r in inner.requests] == ["1.1.1.1"]
        return
    with pytest.raises(EgressRefusedError):
        transport.handle_request(request)
    assert inner.requests == []


def test_refusals_say_what_to_do(suite_path: Path, tmp_path: Path) -> None:
    url = "http://internal.example/v1?key=sk-secret"
    with pytest.raises(EgressRefusedError) as caught:
        check_url(url, EgressPolicy(), FakeResolver())
    message = str(caught.value)
    assert f"ask the operator to add the host to {ALLOWLIST_SETTING}" in message
    assert "internal.example" in message and "10.0.0.5" in message
    assert "sk-secret" not in message and "/v1" not in message, "the path and query may hold secrets"
    # the gateway refuses such a submission with 403 and hands the user the same advice
    settings = gateway_settings("redis://127.0.0.1:9/0", suite_path, tmp_path, EGRESS_ALLOWLIST="")
    with pytest.raises(Problem) as refused:
        check_url_field("model.base_url", url, settings, FakeResolver())
    assert refused.value.status == 403 and refused.value.detail == f"model.base_url: {message}"


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1 /", "http://127.0.0.1\t/", "http://127.0.0.1\n.evil.example/", "http://\x00127.0.0.1/"],
)
def test_whitespace_and_control_characters_are_refused(url: str) -> None:
    with pytest.raises(EgressRefusedError, match="whitespace, control characters"):
        check_url(url, EgressPolicy(), FakeResolver())


def test_overlong_urls_are_refused() -> None:
    with pytest.raises(EgressRefusedError, match="characters"):
        check_url("https://api.openai.com/" + "a" * 3000, EgressPolicy(), FakeResolver())


def test_literal_hosts_are_never_looked_up() -> None:
    resolver = FakeResolver()
    for url in ["http://127.0.0.1/", "http://2130706433/", "http://[::ffff:127.0.0.1]/", "http://8.8.8.8/"]:
        with suppress(EgressRefusedError):
            check_url(url, EgressPolicy(), resolver)
    assert resolver.lookups == []


def test_every_resolved_address_is_checked() -> None:
    """One internal address among public ones refuses the host, wherever it comes in the answer."""
    for answer in (["8.8.8.8", "10.1.2.3"], ["10.1.2.3", "8.8.8.8"], ["8.8.8.8", "1.1.1.1", "fd00::1"]):
        resolver = FakeResolver(table={"model.example": answer})
        with pytest.raises(EgressRefusedError):
            check_url("https://model.example/v1", EgressPolicy(), resolver)


def test_unresolvable_hosts_are_refused() -> None:
    with pytest.raises(UnresolvableHostError, match="does not resolve"):
        check_url("https://nowhere.example/v1", EgressPolicy(), FakeResolver())
    with pytest.raises(UnresolvableHostError, match="no address"):
        check_url("https://empty.example/v1", EgressPolicy(), FakeResolver(table={"empty.example": []}))


# --- good URLs ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "addresses"), GOOD_URLS, ids=[url for url, _ in GOOD_URLS])
def test_check_url_passes_public_urls(url: str, addresses: list[str]) -> None:
    target = check_url(url, EgressPolicy(), FakeResolver())
    assert [str(a) for a in target.addresses] == addresses
    assert target.allowed_by is None
    assert target.port == (httpx.URL(url).port or {"http": 80, "https": 443}[target.scheme])


@pytest.mark.parametrize(("url", "addresses"), GOOD_URLS, ids=[url for url, _ in GOOD_URLS])
def test_pinned_transport_sends_public_urls_to_the_checked_address(
    url: str, addresses: list[str], machine_network: MachineNetwork
) -> None:
    inner = RecordingTransport()
    resolver = FakeResolver()
    with httpx.Client(transport=pinned_transport(EgressPolicy(), resolver, inner), follow_redirects=False) as client:
        response = client.post(url, json={"model": "m"})
    assert response.status_code == 200
    assert str(response.request.url) == str(httpx.URL(url)), "the caller sees its own URL"
    (sent,) = inner.requests
    original = httpx.URL(url)
    assert sent.url.host == addresses[0]
    assert sent.url.port == original.port and sent.url.raw_path == original.raw_path
    assert sent.headers["host"] == original.netloc.decode()
    assert sent.read() == b'{"model":"m"}'
    is_name = not original.host.replace(".", "").isdigit() and ":" not in original.host
    if original.scheme == "https" and is_name:
        assert sent.extensions["sni_hostname"] == original.raw_host.decode().removesuffix(".")
    else:
        assert "sni_hostname" not in sent.extensions
    assert len(resolver.lookups) == (1 if is_name else 0)
    assert machine_network.connections == [] and machine_network.lookups == []


# --- the allowlist --------------------------------------------------------------------------------------------


def test_policy_parse() -> None:
    policy = EgressPolicy.parse(" replay, 10.0.0.0/8 ,*.SVC.cluster.local,, ::1, Model.Example., fd00::/8 ")
    assert policy.hosts == frozenset({"replay", "model.example"})
    assert policy.suffixes == (".svc.cluster.local",)
    assert [str(n) for n in policy.networks] == ["10.0.0.0/8", "::1/128", "fd00::/8"]
    assert EgressPolicy.parse("") == EgressPolicy()
    assert EgressPolicy.parse(" , ") == EgressPolicy()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("*", "every host"),
        ("replay, *.", "every host"),
        ("10.0.0.1/8", "base address"),
        ("10.0.0.0/33", "not an address"),
        ("127.1", "non-canonical"),
        ("bad host", "not a valid host name"),
        ("host:8000", "not an address"),
        ("http://replay", "not an address"),
    ],
)
def test_policy_parse_refuses_bad_entries(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem) as caught:
        EgressPolicy.parse(text)
    assert ALLOWLIST_SETTING in str(caught.value)


def test_allowlisted_name_is_permitted_whatever_it_resolves_to() -> None:
    policy = EgressPolicy.parse("replay, localhost")
    resolver = FakeResolver(table={**FAKE_DNS, "replay": ["172.18.0.5", "127.0.0.1"], "localhost": ["127.0.0.1"]})
    target = check_url("http://replay:8000/v1", policy, resolver)
    assert target.allowed_by == "replay"
    assert [str(a) for a in target.addresses] == ["172.18.0.5", "127.0.0.1"]
    assert check_url("http://REPLAY.:8000/v1", policy, resolver).allowed_by == "replay"
    assert check_url("http://localhost:8000/v1", policy, resolver).allowed_by == "localhost"
    with pytest.raises(EgressRefusedError, match="loopback name"):
        check_url("http://model.localhost/v1", policy, resolver)


def test_allowlisted_name_does_not_permit_other_spellings() -> None:
    policy = EgressPolicy.parse("replay")
    resolver = FakeResolver(table={"replay.evil.example": ["10.0.0.9"], "xreplay": ["10.0.0.9"]})
    for url in ["http://127.0.0.1/", "http://replay.evil.example/", "http://xreplay/"]:
        with pytest.raises(EgressRefusedError):
            check_url(url, policy, resolver)


def test_wildcard_permits_names_below_the_suffix_only() -> None:
    policy = EgressPolicy.parse("*.svc.cluster.local")
    target = check_url("http://vllm.models.svc.cluster.local:8000/v1", policy, FakeResolver())
    assert target.allowed_by == "*.svc.cluster.local"
    assert [str(a) for a in target.addresses] == ["10.96.0.10"]
    for url in ["http://svc.cluster.local/", "http://evilsvc.cluster.local/"]:
        with pytest.raises(EgressRefusedError, match="private"):
            check_url(url, policy, FakeResolver())


def test_cidr_permits_its_addresses_and_only_those() -> None:
    policy = EgressPolicy.parse("10.0.0.0/8")
    assert [str(a) for a in check_url("http://internal.example/v1", policy, FakeResolver()).addresses] == ["10.0.0.5"]
    assert check_url("http://10.1.2.3:8000/v1", policy, FakeResolver()).is_literal
    assert check_url("http://[::ffff:10.1.2.3]/v1", policy, FakeResolver()).addresses
    mixed = FakeResolver(table={"model.example": ["10.0.0.5", "127.0.0.1"]})
    with pytest.raises(EgressRefusedError, match="loopback"):
        check_url("http://model.example/v1", policy, mixed)
    with pytest.raises(EgressRefusedError, match="private"):
        check_url("http://192.168.1.1/", policy, FakeResolver())
    with pytest.raises(EgressRefusedError, match="non-canonical"):
        check_url("http://10.1/", policy, FakeResolver())


def test_ipv6_cidr() -> None:
    policy = EgressPolicy.parse("fd00::/8")
    assert check_url("http://ula.example/v1", policy, FakeResolver()).addresses
    with pytest.raises(EgressRefusedError, match="zone id"):
        check_url("http://[fd00::1%25eth0]/", policy, FakeResolver())


# --- the address table ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "address",
    ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "2a00:1450:4001::1", "::ffff:1.1.1.1", "64:ff9b::808:808"],
)
def test_public_addresses(address: str) -> None:
    assert address_refusal(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(
    "address",
    [
        "0.0.0.0",
        "0.1.2.3",
        "10.255.255.255",
        "100.127.255.255",
        "127.255.255.254",
        "169.254.169.254",
        "172.31.0.1",
        "192.0.0.8",
        "192.0.2.1",
        "192.88.99.1",
        "192.168.255.255",
        "198.19.255.255",
        "198.51.100.1",
        "203.0.113.1",
        "224.0.0.1",
        "239.0.0.1",
        "240.0.0.1",
        "255.255.255.255",
        "::",
        "::1",
        "::7f00:1",
        "::ffff:0.0.0.0",
        "::ffff:192.168.0.1",
        "64:ff9b::c0a8:1",
        "64:ff9b:1::1",
        "100::1",
        "2001::1",
        "2001:10::1",
        "2001:db8::1",
        "2002:c0a8:1::1",
        "3fff::1",
        "5f00::1",
        "fc00::1",
        "fdff:ffff::1",
        "fe80::1",
        "febf::1",
        "fec0::1",
        "ff00::1",
        "ff02::fb",
        "1::1",
        "4000::1",
        "e000::1",
    ],
)
def test_refused_addresses(address: str) -> None:
    assert address_refusal(ipaddress.ip_address(address)) is not None


# --- the pinned transport -------------------------------------------------------------------------------------


def test_dns_rebinding_connects_to_the_checked_address() -> None:
    """The first answer is public, every later one loopback: each request is resolved once, sent to the address
    that was checked, and a request whose answer changed to loopback is refused before anything is sent."""
    resolver = FakeResolver(table={}, sequences={"rebind.example": [["8.8.8.8"], ["127.0.0.1"]]})
    inner = RecordingTransport()
    with httpx.Client(transport=pinned_transport(EgressPolicy(), resolver, inner), follow_redirects=False) as client:
        assert client.get("https://rebind.example/v1/models").status_code == 200
        assert [r.url.host for r in inner.requests] == ["8.8.8.8"]
        assert inner.requests[0].extensions["sni_hostname"] == "rebind.example"
        assert resolver.lookups == [("rebind.example", 443)], "one lookup: the one that was checked"
        with pytest.raises(EgressRefusedError, match="loopback"):
            client.get("https://rebind.example/v1/models")
    assert len(inner.requests) == 1
    assert len(resolver.lookups) == 2


def test_dns_rebinding_against_real_servers(machine_network: MachineNetwork) -> None:
    """Two real servers on one port: 127.0.0.1 (allowed) and 127.0.0.2 (refused). The name first resolves to
    127.0.0.1, then to 127.0.0.2. A naive check-then-connect client lands on 127.0.0.2; the pinned one does not."""
    with ExitStack() as stack:
        allowed = stack.enter_context(serving("127.0.0.1"))
        try:
            refused = stack.enter_context(serving("127.0.0.2", allowed.port))
        except OSError as exc:  # pragma: no cover - depends on the machine's loopback
            pytest.skip(f"cannot listen on 127.0.0.2: {exc}")
        url = f"http://model.test:{allowed.port}/v1/models"

        # naive: check, then let httpx resolve the name again (the system now answers 127.0.0.2)
        check_url(url, LOOPBACK_POLICY, loopback_resolver("model.test"))
        machine_network.names["model.test"] = "127.0.0.2"
        with httpx.Client(trust_env=False, follow_redirects=False) as naive:
            assert naive.get(url).status_code == 200
        assert len(refused.requests) == 1, "the contrast: a second lookup reaches the refused server"

        resolver = FakeResolver(table={}, sequences={"model.test": [["127.0.0.1"], ["127.0.0.2"]]})
        with httpx.Client(transport=pinned_transport(LOOPBACK_POLICY, resolver), follow_redirects=False) as pinned:
            assert pinned.get(url).status_code == 200
            with pytest.raises(EgressRefusedError, match="127.0.0.2, a loopback address"):
                pinned.get(url)
        assert allowed.requests == [{"method": "GET", "path": "/v1/models", "host": f"model.test:{allowed.port}"}]
        assert len(refused.requests) == 1 and refused.connections == 1, "nothing more reached 127.0.0.2"


def test_pinned_request_reaches_a_real_server_by_name(machine_network: MachineNetwork) -> None:
    with serving() as server:
        resolver = loopback_resolver("model.test")
        base_url = f"http://model.test:{server.port}/v1"
        transport = pinned_transport(LOOPBACK_POLICY, resolver)
        with httpx.Client(base_url=base_url, transport=transport, follow_redirects=False) as client:
            for _ in range(2):
                response = client.post("/chat/completions", json={"model": "m", "messages": []})
                assert response.status_code == 200
                assert response.json()["choices"][0]["message"]["content"] == "hi"
    assert (
        server.requests == [{"method": "POST", "path": "/v1/chat/completions", "host": f"model.test:{server.port}"}] * 2
    )
    assert server.connections == 1, "the connection to the checked address is kept alive"
    assert resolver.lookups == [("model.test", server.port)] * 2, "one lookup per request"
    assert "model.test" not in machine_network.lookups, "the system resolver never saw the name"
    assert set(machine_network.connections) == {"127.0.0.1"}


def test_an_ipv6_literal_endpoint_is_checked_without_a_lookup_then_reached(machine_network: MachineNetwork) -> None:
    with serving("::1") as server:
        base_url = f"http://[::1]:{server.port}/v1"
        with pytest.raises(EgressRefusedError, match="loopback"):
            check_url(base_url, LOOPBACK_POLICY)  # 127.0.0.1 is allowed, ::1 is not
        policy = EgressPolicy.parse("::1")
        with httpx.Client(base_url=base_url, transport=pinned_transport(policy), follow_redirects=False) as client:
            response = client.post("/chat/completions", json={"model": "m", "messages": []})
            assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == "hi"
    assert server.requests == [{"method": "POST", "path": "/v1/chat/completions", "host": f"[::1]:{server.port}"}]
    # The only "lookup" is the socket layer parsing the literal it was given; no name was resolved.
    assert set(machine_network.lookups) <= {"::1"} and machine_network.connections == ["::1"]


def test_refused_name_never_reaches_a_real_server() -> None:
    """``model.test`` resolves to the real server's address, but the policy does not allow loopback."""
    with serving() as server:
        resolver = loopback_resolver("model.test")
        with httpx.Client(transport=pinned_transport(EgressPolicy(), resolver), follow_redirects=False) as client:
            with pytest.raises(EgressRefusedError, match="127.0.0.1, a loopback address"):
                client.get(f"http://model.test:{server.port}/v1/models")
            with pytest.raises(EgressRefusedError, match="loopback"):
                client.get(f"http://127.0.0.1:{server.port}/v1/models")
            with pytest.raises(EgressRefusedError, match="non-canonical"):
                client.get(f"http://2130706433:{server.port}/v1/models")
    assert server.connections == 0 and server.requests == []


def test_unresolvable_host_is_a_connect_error() -> None:
    inner = RecordingTransport()
    client = httpx.Client(transport=pinned_transport(EgressPolicy(), FakeResolver(), inner))
    with client, pytest.raises(httpx.ConnectError, match="does not resolve") as caught:
        client.get("https://nowhere.example/v1")
    assert isinstance(caught.value.__cause__, UnresolvableHostError)
    assert inner.requests == []


def test_next_checked_address_is_tried_when_connecting_fails() -> None:
    inner = RecordingTransport(fail_for={"2606:4700:4700::1111"})
    resolver = FakeResolver(table={"dual.example": ["2606:4700:4700::1111", "1.1.1.1"]})
    with httpx.Client(transport=pinned_transport(EgressPolicy(), resolver, inner)) as client:
        assert client.get("https://dual.example/v1").status_code == 200
    assert [r.url.host for r in inner.requests] == ["2606:4700:4700::1111", "1.1.1.1"]
    assert len(resolver.lookups) == 1

    inner = RecordingTransport(fail_for={"1.1.1.1"})
    client = httpx.Client(transport=pinned_transport(EgressPolicy(), FakeResolver(), inner))
    with client, pytest.raises(httpx.ConnectError):
        client.get("https://public.example/v1")


def test_transport_closes_its_inner_transport() -> None:
    inner = RecordingTransport()
    with httpx.Client(transport=PinnedTransport(EgressPolicy(), resolver=FakeResolver(), inner=inner)):
        pass
    assert inner.closed


def test_default_resolver_reads_literals_without_dns(machine_network: MachineNetwork) -> None:
    assert resolve_host("127.0.0.1", 80) == ["127.0.0.1"]
    assert machine_network.lookups == ["127.0.0.1"]
    with pytest.raises(EgressRefusedError, match="loopback"):
        check_url("http://127.0.0.1/", EgressPolicy())
    with pytest.raises(EgressRefusedError, match="loopback name"):
        check_url("http://localhost/", EgressPolicy())


# --- TLS: SNI and certificate verification stay on the host name ----------------------------------------------


def test_tls_verifies_the_original_host_name(certificates: Certificates) -> None:
    with serving(tls=certificates.server()) as server:
        resolver = loopback_resolver("model.test", "other.test")
        transport = pinned_transport(LOOPBACK_POLICY, resolver, verify=certificates.client)
        with httpx.Client(transport=transport, follow_redirects=False) as client:
            response = client.get(f"https://model.test:{server.port}/v1/models")
            assert response.status_code == 200
            assert server.server_names == ["model.test"], "SNI carries the host name, not the address"
            assert server.requests[-1]["host"] == f"model.test:{server.port}"

            # other.test resolves to the same address and port, but the certificate is not for it; the
            # kept-alive connection verified for model.test must not be reused for it
            with pytest.raises(httpx.ConnectError, match="(?i)certificate verify failed|hostname mismatch"):
                client.get(f"https://other.test:{server.port}/v1/models")
            assert len(server.requests) == 1

        # control: the certificate does not cover the address, so the success above was verified by name
        plain = httpx.Client(verify=certificates.client, trust_env=False)
        with plain, pytest.raises(httpx.ConnectError, match="(?i)certificate verify failed|IP address mismatch"):
            plain.get(f"https://127.0.0.1:{server.port}/v1/models")


def test_tls_with_an_untrusted_certificate_fails(certificates: Certificates) -> None:
    """The pinned transport verifies with the default trust store unless told otherwise."""
    with serving(tls=certificates.server()) as server:
        transport = pinned_transport(LOOPBACK_POLICY, loopback_resolver("model.test"))
        client = httpx.Client(transport=transport)
        with client, pytest.raises(httpx.ConnectError, match="(?i)certificate verify failed"):
            client.get(f"https://model.test:{server.port}/v1/models")
        assert server.requests == []
