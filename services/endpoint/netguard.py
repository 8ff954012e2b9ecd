"""The egress guard: model endpoint URLs come from users, so no worker may be pointed at an internal address.

Three pieces:

- ``check_url`` parses a URL the way httpx does, refuses what is not a plain ``http(s)://host[:port]`` URL,
  resolves the host and checks every address it resolves to; it returns a ``CheckedTarget``.
- ``EgressPolicy`` is the operator's allowlist (``PBE_EGRESS_ALLOWLIST``): host names (exact or ``*.suffix``)
  that are permitted whatever they resolve to, and networks (CIDRs) whose addresses are permitted.
- ``PinnedTransport`` (made by ``pinned_transport``) is an httpx transport that checks each request's URL when
  it is sent and connects to the address it checked (no second DNS lookup, so DNS rebinding cannot slip an
  internal address in between the check and the connection); the ``Host`` header, the TLS SNI and the
  certificate check stay on the URL's host name.

Refused: every scheme but ``http`` and ``https``; user information (``user:pass@``); an empty host; a port
outside 1..65535 or not written in decimal digits; a host that is an IPv4 address in any form but four
decimal numbers (``2130706433``, ``0177.0.0.1``, ``0x7f000001``, ``127.1``, ``127.0.0.1.``); an IPv6 literal
with a zone id; a host name that is not letters, digits, ``-`` and ``_`` (percent escapes, spaces) or whose
punycode is invalid; ``localhost`` and ``*.localhost``; and every address in the special-purpose ranges listed
in ``IPV4_REFUSED`` and ``IPV6_REFUSED`` (loopback, private, link-local with the cloud metadata service,
carrier-grade NAT, multicast, reserved, unspecified, broadcast, documentation, ...), IPv6 outside ``2000::/3``,
IPv4-mapped and NAT64 forms of refused IPv4 addresses, and the 6to4, Teredo and IPv4-compatible forms. On top
of the lists, an address the stdlib ``ipaddress`` module does not call global is refused too.

Errors::

    ValueError
    └── EgressRefusedError        the URL, its host or one of the host's addresses is not allowed
        └── UnresolvableHostError the host does not resolve (the guard refuses what it cannot check)

``PinnedTransport`` raises ``EgressRefusedError`` as it is (a refusal is final, not worth a retry) and turns
``UnresolvableHostError`` into ``httpx.ConnectError``, like any DNS failure.
"""

import ipaddress
import re
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeAlias

import httpx
import idna

IPAddress: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network

Resolver: TypeAlias = Callable[[str, int], Iterable[str]]
"""Resolves ``(host, port)`` to IP address strings; raises ``OSError`` when the host does not resolve."""

ALLOWLIST_SETTING = "PBE_EGRESS_ALLOWLIST"
"""The setting an operator extends to permit an internal endpoint."""

ALLOWED_SCHEMES = frozenset({"http", "https"})
"""The only URL schemes a model endpoint may have."""

MAX_URL_CHARS = 2048
"""The longest URL that is checked at all."""

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network

IPV4_REFUSED: tuple[tuple[ipaddress.IPv4Network, str], ...] = (
    (_V4("0.0.0.0/32"), "the unspecified address"),
    (_V4("0.0.0.0/8"), "a 'this network' address (unspecified, RFC 1122)"),
    (_V4("10.0.0.0/8"), "a private address (RFC 1918)"),
    (_V4("100.64.0.0/10"), "a carrier-grade NAT address (CGNAT, RFC 6598)"),
    (_V4("127.0.0.0/8"), "a loopback address"),
    (_V4("169.254.169.254/32"), "the cloud metadata service, a link-local address"),
    (_V4("169.254.0.0/16"), "a link-local address"),
    (_V4("172.16.0.0/12"), "a private address (RFC 1918)"),
    (_V4("192.0.0.0/24"), "a reserved address (IETF protocol assignments, RFC 6890)"),
    (_V4("192.0.2.0/24"), "a documentation address (TEST-NET-1)"),
    (_V4("192.31.196.0/24"), "a reserved address (AS112, RFC 7535)"),
    (_V4("192.52.193.0/24"), "a reserved address (AMT, RFC 7450)"),
    (_V4("192.88.99.0/24"), "a reserved address (6to4 relay anycast, deprecated)"),
    (_V4("192.168.0.0/16"), "a private address (RFC 1918)"),
    (_V4("192.175.48.0/24"), "a reserved address (AS112 direct delegation, RFC 7534)"),
    (_V4("198.18.0.0/15"), "a reserved address (benchmarking, RFC 2544)"),
    (_V4("198.51.100.0/24"), "a documentation address (TEST-NET-2)"),
    (_V4("203.0.113.0/24"), "a documentation address (TEST-NET-3)"),
    (_V4("224.0.0.0/4"), "a multicast address"),
    (_V4("255.255.255.255/32"), "the broadcast address"),
    (_V4("240.0.0.0/4"), "a reserved address (240.0.0.0/4)"),
)
"""Refused IPv4 ranges with what they are; the first match names the refusal."""

IPV6_REFUSED: tuple[tuple[ipaddress.IPv6Network, str], ...] = (
    (_V6("::/128"), "the unspecified address"),
    (_V6("::1/128"), "a loopback address"),
    (_V6("::/96"), "an IPv4-compatible address (deprecated, RFC 4291)"),
    (_V6("64:ff9b:1::/48"), "a local-use NAT64 address (RFC 8215)"),
    (_V6("100::/64"), "a reserved address (discard-only, RFC 6666)"),
    (_V6("2001::/32"), "a Teredo address"),
    (_V6("2001::/23"), "a reserved address (IETF protocol assignments, RFC 2928)"),
    (_V6("2001:db8::/32"), "a documentation address"),
    (_V6("2002::/16"), "a 6to4 address (deprecated, RFC 7526)"),
    (_V6("3fff::/20"), "a documentation address"),
    (_V6("5f00::/16"), "a reserved address (SRv6 segment identifiers, RFC 9602)"),
    (_V6("fc00::/7"), "a private address (unique local, fc00::/7)"),
    (_V6("fe80::/10"), "a link-local address"),
    (_V6("fec0::/10"), "a site-local address (deprecated)"),
    (_V6("ff00::/8"), "a multicast address"),
)
"""Refused IPv6 ranges with what they are; the first match names the refusal. IPv4-mapped (``::ffff:0:0/96``)
and NAT64 (``64:ff9b::/96``) addresses are judged by the IPv4 address they carry."""

IPV6_GLOBAL_UNICAST = _V6("2000::/3")
"""The only IPv6 range with public addresses; everything outside it (and not IPv4-mapped or NAT64) is refused."""

_NAT64 = _V6("64:ff9b::/96")
_NUMERIC_LABEL = re.compile(r"(?:0[xX][0-9a-fA-F]*|[0-9]+)")
_NAME_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_PORT = re.compile(r"[0-9]{1,5}")
_DEFAULT_PORTS = {"http": 80, "https": 443}


class EgressRefusedError(ValueError):
    """The URL, its host or one of the host's addresses is not allowed; the message says why and what to do."""


class UnresolvableHostError(EgressRefusedError):
    """The host does not resolve, so it cannot be checked."""


@dataclass(frozen=True)
class EgressPolicy:
    """The operator's allowlist: what is permitted even though it is internal.

    An empty policy (the default) permits public addresses only. Build one with ``EgressPolicy.parse``.
    """

    hosts: frozenset[str] = frozenset()
    """Host names permitted whatever they resolve to (lower case, ASCII, no trailing dot)."""
    suffixes: tuple[str, ...] = ()
    """From ``*.suffix`` entries, with the leading dot (``.svc.cluster.local``): any name below it is permitted,
    the suffix itself is not."""
    networks: tuple[IPNetwork, ...] = ()
    """Networks whose addresses are permitted."""

    @classmethod
    def parse(cls, text: str) -> "EgressPolicy":
        """Read a comma-separated allowlist such as ``"replay, 10.0.0.0/8, *.svc.cluster.local"``.

        Entries are host names (``vllm.models.svc.cluster.local``, ``replay``), wildcards (``*.suffix``: the
        names below the suffix), addresses (``127.0.0.1``, ``::1``) and networks (``10.0.0.0/8``, ``fd00::/8``).
        Blank entries are skipped.

        Raises:
            ValueError: an entry is none of these (the message names it), or is a bare ``*``.
        """
        hosts: set[str] = set()
        suffixes: list[str] = []
        networks: list[IPNetwork] = []
        for raw in text.split(","):
            entry = raw.strip().lower()
            if not entry:
                continue
            if entry in ("*", "*."):
                raise ValueError(f"{ALLOWLIST_SETTING}: a bare {entry!r} would permit every host; list the hosts")
            if "/" in entry or ":" in entry or _is_dotted_quad(entry):
                try:
                    networks.append(ipaddress.ip_network(entry, strict=True))
                except ValueError as exc:
                    raise ValueError(
                        f"{ALLOWLIST_SETTING}: {raw.strip()!r} is not an address or a network ({exc}); "
                        "write a network with its base address, such as 10.0.0.0/8"
                    ) from exc
                continue
            name = entry[2:] if entry.startswith("*.") else entry
            problem = _name_problem(name.removesuffix("."))
            if problem is not None:
                raise ValueError(f"{ALLOWLIST_SETTING}: {raw.strip()!r}: {problem}")
            if entry.startswith("*."):
                suffixes.append("." + name.removesuffix("."))
            else:
                hosts.add(name.removesuffix("."))
        return cls(hosts=frozenset(hosts), suffixes=tuple(dict.fromkeys(suffixes)), networks=tuple(networks))

    def match_name(self, host: str) -> str | None:
        """Return the allowlist entry that permits host name ``host`` (``"replay"``, ``"*.svc.cluster.local"``),
        or None. ``host`` is compared in lower case without a trailing dot."""
        name = host.lower().removesuffix(".")
        if name in self.hosts:
            return name
        for suffix in self.suffixes:
            if name.endswith(suffix) and len(name) > len(suffix):
                return "*" + suffix
        return None

    def match_address(self, address: IPAddress) -> IPNetwork | None:
        """Return the allowed network that holds ``address`` (an IPv4-mapped IPv6 address counts as its IPv4
        address), or None."""
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        for network in self.networks:
            if address.version == network.version and address in network:
                return network
        return None


@dataclass(frozen=True)
class CheckedTarget:
    """A URL that passed ``check_url``, with the addresses its host resolved to (all of them checked)."""

    url: str
    """The URL as httpx normalises it."""
    scheme: str
    host: str
    """The host as sent on the wire: lower case, IDN names in punycode, no trailing dot, IPv6 without brackets."""
    port: int
    """The port, the scheme's default when the URL has none."""
    addresses: tuple[IPAddress, ...]
    """Every address the host resolved to, in the resolver's order; the host's own address for a literal."""
    is_literal: bool = False
    """The host is an IP address, not a name."""
    allowed_by: str | None = None
    """The allowlist entry that permitted the host by name, if one did."""


def resolve_host(host: str, port: int) -> list[str]:
    """The default resolver: ``socket.getaddrinfo`` for TCP, IPv4 and IPv6, in the system's order.

    An IPv6 answer with a scope keeps it as a zone id (``fe80::1%2``), so that the check refuses it.

    Raises:
        OSError: the host does not resolve (``socket.gaierror``).
    """
    answers: list[str] = []
    for family, _, _, _, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        address = str(sockaddr[0])
        if family == socket.AF_INET6 and len(sockaddr) >= 4 and sockaddr[3] and "%" not in address:
            address = f"{address}%{sockaddr[3]}"
        answers.append(address)
    return answers


def check_url(url: str | httpx.URL, policy: EgressPolicy, resolver: Resolver = resolve_host) -> CheckedTarget:
    """Check that ``url`` may be called: its form, then every address its host resolves to.

    The URL is parsed as httpx parses it. A host name in ``policy`` is permitted whatever it resolves to (it is
    still resolved, to know where to connect); otherwise every address must be public or in one of the
    policy's networks. An IP literal host is checked without a lookup.

    Args:
        url: the URL, such as a model endpoint's base URL.
        policy: the operator's allowlist.
        resolver: ``(host, port) -> addresses``; ``resolve_host`` (``getaddrinfo``) unless a test injects one.

    Returns:
        The checked target, with the addresses to connect to.

    Raises:
        EgressRefusedError: the URL is malformed or not plain ``http(s)://host[:port]``, or an address of the
            host is internal; the message says which and what to do.
        UnresolvableHostError: the host does not resolve (or the resolver answered nothing).
    """
    text = str(url)
    parsed = _parse(text)
    scheme = parsed.scheme
    raw_host = parsed.raw_host.decode("ascii")
    port = parsed.port if parsed.port is not None else _DEFAULT_PORTS[scheme]
    where = _where(scheme, raw_host, port)
    literal = _literal_address(raw_host, where)
    if literal is not None:
        if policy.match_address(literal) is None:
            _refuse_address(where, literal)
        return CheckedTarget(str(parsed), scheme, str(literal), port, (literal,), is_literal=True)

    name = raw_host.removesuffix(".")
    problem = _name_problem(name)
    if problem is not None:
        raise EgressRefusedError(f"refused {where}: {problem}; give the model endpoint's host name or IP address")
    allowed_by = policy.match_name(name)
    if allowed_by is None and (name == "localhost" or name.endswith(".localhost")):
        raise EgressRefusedError(
            f"refused {where}: {name!r} is this machine (a loopback name); "
            f"ask the operator to add the host to {ALLOWLIST_SETTING} if the endpoint is meant to run here"
        )
    addresses = _resolve(resolver, raw_host, port, where)
    if allowed_by is None:
        for address in addresses:
            if policy.match_address(address) is None:
                _refuse_address(where, address, name)
    return CheckedTarget(str(parsed), scheme, name, port, addresses, allowed_by=allowed_by)


def pinned_transport(
    policy: EgressPolicy,
    resolver: Resolver = resolve_host,
    inner: httpx.BaseTransport | None = None,
    *,
    verify: ssl.SSLContext | bool = True,
) -> "PinnedTransport":
    """Make an httpx transport that checks every request's URL and connects to the checked address.

    Give it to a client that does not follow redirects: ``httpx.Client(transport=..., follow_redirects=False)``.
    See ``PinnedTransport`` for the arguments.
    """
    return PinnedTransport(policy, resolver=resolver, inner=inner, verify=verify)


class PinnedTransport(httpx.BaseTransport):
    """An httpx transport that checks each request's URL when it is sent, then connects to the checked address.

    For each request the host is resolved once and every address checked (``check_url``). The request goes out
    with its URL's host replaced by the first address (the next ones are tried when connecting fails), its
    ``Host`` header unchanged, and for ``https`` the ``sni_hostname`` extension set to the URL's host name:
    httpcore hands it to ``ssl`` as ``server_hostname``, which sends it as SNI and verifies the certificate
    against it. There is no second lookup, so a name cannot resolve to a public address for the check and to an
    internal one for the connection.

    Without ``inner``, the transport keeps one ``httpx.HTTPTransport`` (connection pool) per host name, so that a
    TLS connection verified for one name is never reused for another name that resolves to the same address.
    With ``inner``, every pinned request goes through it (tests, a customised transport); share such a transport
    between host names only over plain HTTP or when the names share a certificate.
    """

    def __init__(
        self,
        policy: EgressPolicy,
        *,
        resolver: Resolver = resolve_host,
        inner: httpx.BaseTransport | None = None,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        """Make the transport.

        Args:
            policy: the operator's allowlist.
            resolver: ``(host, port) -> addresses``, called once per request.
            inner: the transport that sends the pinned requests (it is closed with this one); by default an
                ``httpx.HTTPTransport`` per host name.
            verify: TLS verification of the default transports (an ``ssl.SSLContext`` for a private CA).
        """
        self.policy = policy
        self._resolver = resolver
        self._inner = inner
        self._verify = verify
        self._pools: dict[str, httpx.BaseTransport] = {}
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Check the request's URL, then send it to the checked address.

        Raises:
            EgressRefusedError: the URL or an address of its host is refused; nothing was sent.
            httpx.ConnectError: the host does not resolve, or no checked address accepted the connection.
            httpx.TransportError: whatever the inner transport raises after connecting.
        """
        try:
            target = check_url(request.url, self.policy, self._resolver)
        except UnresolvableHostError as exc:
            raise httpx.ConnectError(str(exc), request=request) from exc
        transport = self._transport_for(target.host)
        *first, last = target.addresses
        for address in first:
            try:
                return transport.handle_request(_pin(request, target, address))
            except httpx.ConnectError:
                continue
        return transport.handle_request(_pin(request, target, last))

    def close(self) -> None:
        with self._lock:
            pools = list(self._pools.values())
            self._pools.clear()
        for pool in pools:
            pool.close()
        if self._inner is not None:
            self._inner.close()

    def _transport_for(self, host: str) -> httpx.BaseTransport:
        if self._inner is not None:
            return self._inner
        with self._lock:
            pool = self._pools.get(host)
            if pool is None:
                pool = self._pools[host] = httpx.HTTPTransport(verify=self._verify)
            return pool


def _pin(request: httpx.Request, target: CheckedTarget, address: IPAddress) -> httpx.Request:
    """A copy of ``request`` addressed to ``address``, with the original Host header and TLS server name."""
    headers = request.headers.copy()
    if "host" not in headers:
        headers["Host"] = request.url.netloc.decode("ascii")
    extensions = dict(request.extensions)
    if target.scheme == "https" and not target.is_literal:
        extensions["sni_hostname"] = target.host
    return httpx.Request(
        request.method,
        request.url.copy_with(host=str(address)),
        headers=headers,
        stream=request.stream,
        extensions=extensions,
    )


def _parse(text: str) -> httpx.URL:
    """Parse ``text`` as httpx does, refusing what is not ``http(s)://host[:port]``.

    Raises:
        EgressRefusedError: what is wrong, and what a good URL looks like.
    """
    if len(text) > MAX_URL_CHARS:
        raise EgressRefusedError(f"refused a URL of {len(text)} characters: at most {MAX_URL_CHARS} are checked")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F or c == "\\" for c in text):
        raise EgressRefusedError(
            "refused a URL with whitespace, control characters or backslashes: give the plain base URL, "
            "such as https://api.example.com/v1"
        )
    scheme, sep, rest = text.partition("://")
    if not sep:
        raise EgressRefusedError(
            "refused a URL that does not start with http:// or https://: only http and https URLs are accepted, "
            "such as https://api.example.com/v1"
        )
    if scheme.lower() not in ALLOWED_SCHEMES:
        shown = scheme.lower() if scheme.isascii() and scheme.isalnum() else "?"
        raise EgressRefusedError(
            f"refused a URL with scheme {shown!r}: only http and https URLs are accepted, "
            "such as https://api.example.com/v1"
        )
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if "@" in authority:
        raise EgressRefusedError(
            "refused a URL with user information (user:password@): pass credentials as the API key, never in the URL"
        )
    port_text = "" if authority.endswith("]") else authority.rpartition(":")[2] if ":" in authority else ""
    if ":" in authority and not authority.endswith("]") and not _PORT.fullmatch(port_text):
        raise EgressRefusedError(f"refused a URL whose port {port_text!r} is not a number from 1 to 65535")
    try:
        parsed = httpx.URL(text)
    except httpx.InvalidURL as exc:
        raise EgressRefusedError(f"refused a URL that is not valid ({exc}); check the host name") from exc
    if not parsed.raw_host:
        raise EgressRefusedError("refused a URL without a host: give the full base URL, such as https://host/v1")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise EgressRefusedError(f"refused a URL with port {parsed.port}: a port is a number from 1 to 65535")
    return parsed


def _where(scheme: str, host: str, port: int) -> str:
    """``scheme://host:port`` for messages: never the path or the query, which may hold a key."""
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}"


def _literal_address(host: str, where: str) -> IPAddress | None:
    """The address when ``host`` is an IP literal, None when it is a name.

    Raises:
        EgressRefusedError: an IPv6 literal with a zone id, or an IPv4 address in a non-canonical form (any form
            but four decimal numbers, which some resolvers would read as an address).
    """
    if ":" in host:
        if "%" in host:
            raise EgressRefusedError(
                f"refused {where}: an IPv6 address with a zone id reaches this machine's own links; "
                "give a global address or a host name"
            )
        try:
            return ipaddress.IPv6Address(host)
        except ValueError as exc:
            raise EgressRefusedError(f"refused {where}: {host!r} is not an IPv6 address") from exc
    labels = host.split(".")
    if len(labels) > 1 and labels[-1] == "":
        labels = labels[:-1]
    if not _NUMERIC_LABEL.fullmatch(labels[-1]):
        return None
    if _is_dotted_quad(host):
        return ipaddress.IPv4Address(host)
    raise EgressRefusedError(
        f"refused {where}: {host!r} is an IPv4 address in a non-canonical form (decimal, octal, hexadecimal, "
        "shortened or with a trailing dot); write the address as four decimal numbers, such as 8.8.8.8"
    )


def _is_dotted_quad(text: str) -> bool:
    try:
        return str(ipaddress.IPv4Address(text)) == text
    except ValueError:
        return False


def _name_problem(name: str) -> str | None:
    """What is wrong with host name ``name`` (ASCII, no trailing dot), or None when it is a valid name."""
    if not name:
        return "the host name is empty"
    if len(name) > 253:
        return "the host name is longer than 253 characters"
    labels = name.split(".")
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        return f"{name!r} is an IPv4 address in a non-canonical form; write it as four decimal numbers"
    for label in labels:
        if not _NAME_LABEL.fullmatch(label):
            return f"{name!r} is not a valid host name (letters, digits, '-' and '_' between dots)"
        if label.startswith("xn--"):
            try:
                idna.decode(label)
            except (idna.IDNAError, UnicodeError) as exc:
                return f"{name!r} holds an invalid punycode label {label!r} ({exc})"
    return None


def _resolve(resolver: Resolver, host: str, port: int, where: str) -> tuple[IPAddress, ...]:
    """Resolve ``host`` and parse the answers, without duplicates, in the resolver's order.

    Raises:
        UnresolvableHostError: the resolver raised ``OSError`` or answered nothing.
        EgressRefusedError: an answer is not an IP address.
    """
    try:
        answers = list(resolver(host, port))
    except (OSError, UnicodeError) as exc:
        raise UnresolvableHostError(
            f"refused {where}: the host does not resolve ({exc}); check the host name and that it resolves "
            "from the workers (the guard refuses hosts it cannot check)"
        ) from exc
    addresses: dict[IPAddress, None] = {}
    for answer in answers:
        try:
            addresses[ipaddress.ip_address(answer)] = None
        except ValueError as exc:
            raise EgressRefusedError(f"refused {where}: the resolver answered {answer!r}, not an IP address") from exc
    if not addresses:
        raise UnresolvableHostError(f"refused {where}: the host resolves to no address; check the host name")
    return tuple(addresses)


def _refuse_address(where: str, address: IPAddress, name: str | None = None) -> None:
    """Refuse ``address`` (the host's own, or one that host name ``name`` resolved to) unless it is public.

    Raises:
        EgressRefusedError: ``address`` is not a public address.
    """
    reason = address_refusal(address)
    if reason is None:
        return
    via = f"{address} is" if name is None else f"{name} resolves to {address},"
    raise EgressRefusedError(
        f"refused {where}: {via} {reason}; workers may only call public addresses: if this endpoint is meant "
        f"to be reached, ask the operator to add the host to {ALLOWLIST_SETTING}"
    )


def address_refusal(address: IPAddress) -> str | None:
    """Say why ``address`` may not be called (``"a loopback address"``), or None for a public address.

    The explicit lists decide first; an address the ``ipaddress`` module does not call global is refused too.
    """
    if isinstance(address, ipaddress.IPv6Address):
        if address.scope_id is not None:
            return "an IPv6 address with a zone id"
        embedded = address.ipv4_mapped
        kind = "an IPv4-mapped"
        if embedded is None and address in _NAT64:
            embedded, kind = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF), "a NAT64"
        if embedded is not None:
            reason = address_refusal(embedded)
            return None if reason is None else f"{kind} form of {embedded}, {reason}"
        for network, reason in IPV6_REFUSED:
            if address in network:
                return reason + _embedding(address)
        if address not in IPV6_GLOBAL_UNICAST:
            return "a reserved address (outside 2000::/3, the global unicast range)"
    else:
        for network4, reason in IPV4_REFUSED:
            if address in network4:
                return reason
    if (
        not address.is_global
        or address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
    ):
        return "a special-purpose address (not global)"
    return None


def _embedding(address: ipaddress.IPv6Address) -> str:
    """`` (it carries 127.0.0.1)`` for a 6to4 or Teredo address, else ``""``."""
    if address.sixtofour is not None:
        return f" (it carries {address.sixtofour})"
    if address.teredo is not None:
        server, client = address.teredo
        return f" (it carries {server} and {client})"
    return ""
