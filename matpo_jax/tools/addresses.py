"""Which URLs a tool may reach, decided before any connection and again on every redirect hop.

- Only http and https.
- Configured services (the search, page and reader endpoints, and any URL listed in
  `allowed_urls`) are trusted by origin (scheme, host, port): a local search service on
  127.0.0.1 is reachable, but only on its own port.
- Anything else (a page the model asks `open` to read, a redirect target) must be a public
  address: its host name is resolved here and every address it resolves to must be public (no
  loopback, private, link-local, shared, multicast, reserved or unspecified address). The
  connection then goes to exactly those addresses, so a second DNS answer cannot swap in an
  internal one. A name that does not resolve here is left to an HTTP proxy, if one is set.

Loopback and other non-public hosts, and `localhost`, are always reached directly: environment
proxies (HTTP_PROXY, HTTPS_PROXY, NO_PROXY) apply only to the rest.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import ipaddress
import socket
import time
from typing import Iterable
from urllib.parse import quote, urlsplit

SCHEMES = {"http": 80, "https": 443}


class BlockedUrl(Exception):
    """A URL the policy refuses; the message says why (shown to the model)."""


@dataclasses.dataclass(frozen=True)
class Target:
    """One URL, checked: where to connect and whether a proxy may carry it."""

    scheme: str
    host: str  # lower-case, IDNA-encoded; IPv6 without brackets
    port: int
    path: str  # path and query, as sent
    addresses: tuple[str, ...] | None  # vetted IPs to connect to; None: resolve at connect time
    trusted: bool  # a configured service
    direct: bool  # never through a proxy (non-public or local host)

    @property
    def origin(self) -> tuple[str, str, int]:
        return (self.scheme, self.host, self.port)

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == SCHEMES[self.scheme] else f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host_header}{self.path}"


def parse(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path-and-query) of an http(s) URL; BlockedUrl for anything else."""
    if not isinstance(url, str) or not url.strip():
        raise BlockedUrl("empty URL")
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as e:
        raise BlockedUrl(f"invalid URL ({e})") from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise BlockedUrl(f"only http and https URLs can be opened, not {scheme or 'a relative'!r}")
    if not parts.hostname:
        raise BlockedUrl("the URL has no host")
    try:
        host = parts.hostname.encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise BlockedUrl(f"invalid host name {parts.hostname!r}") from None
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    # Spaces, control and non-ASCII characters percent-encoded; escapes and delimiters kept.
    path = quote(path, safe="!#$%&'()*+,/:;=?@[]~")
    return scheme, host, port or SCHEMES[scheme], path


def origin(url: str) -> tuple[str, str, int]:
    scheme, host, port, _ = parse(url)
    return scheme, host, port


def literal_ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None


def is_public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address | str) -> bool:
    """A globally routable unicast address (IPv4-mapped IPv6 addresses judged as IPv4)."""
    if isinstance(ip, str):
        ip = ipaddress.ip_address(ip.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    # is_global alone lets multicast through (224.0.0.0/4 is not "private").
    return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_loopback
                                 or ip.is_link_local or ip.is_unspecified)


def is_local_name(host: str) -> bool:
    return host == "localhost" or host.endswith(".localhost")


# getaddrinfo has no timeout: it runs on these threads while the caller waits at most until its
# deadline (a resolver that hangs keeps one thread, not the tool call).
_RESOLVER = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="dns")


def resolve(host: str, port: int, deadline: float) -> list[str]:
    """The addresses of `host`, waiting at most until `deadline` (time.monotonic()).
    Raises socket.gaierror when the name does not resolve, TimeoutError past the deadline."""
    ip = literal_ip(host)
    if ip is not None:
        return [str(ip)]
    future = _RESOLVER.submit(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
    try:
        infos = future.result(timeout=min(max(0.0, deadline - time.monotonic()), 3600.0))
    except concurrent.futures.TimeoutError:
        raise TimeoutError(f"resolving {host} took too long") from None
    seen: dict[str, None] = {}
    for *_, sockaddr in infos:
        seen.setdefault(sockaddr[0])
    return list(seen)


class AddressPolicy:
    """Checks URLs against the rules above; thread-safe (the allow-list is only added to)."""

    def __init__(self, allowed_urls: Iterable[str] = ()):
        self._allowed: set[tuple[str, str, int]] = set()
        for url in allowed_urls:
            self.allow(url)

    def allow(self, url: str) -> None:
        """Trusts a configured service's origin (scheme, host, port)."""
        self._allowed.add(origin(url))

    def is_allowed(self, url: str) -> bool:
        try:
            return origin(url) in self._allowed
        except BlockedUrl:
            return False

    def check(self, url: str, deadline: float) -> Target:
        """The target of `url`, or BlockedUrl. Resolves names of untrusted hosts (bounded by
        `deadline`); a name that does not resolve gets `addresses=None` (a proxy may carry it)."""
        scheme, host, port, path = parse(url)
        ip = literal_ip(host)
        local = is_local_name(host) or (ip is not None and not is_public(ip))
        if (scheme, host, port) in self._allowed:
            return Target(scheme, host, port, path, None, trusted=True, direct=local)
        if local:
            raise BlockedUrl(f"{host} is not a public address")
        try:
            addresses = resolve(host, port, deadline)
        except (socket.gaierror, UnicodeError):
            return Target(scheme, host, port, path, None, trusted=False, direct=False)
        if not addresses:
            return Target(scheme, host, port, path, None, trusted=False, direct=False)
        for address in addresses:
            if not is_public(address):
                raise BlockedUrl(f"{host} resolves to {address}, not a public address")
        return Target(scheme, host, port, path, tuple(addresses), trusted=False, direct=False)
