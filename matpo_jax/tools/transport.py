"""HTTP/1.1 requests whose whole duration is bounded by one deadline, for the tool clients.

Every socket operation of a request waits at most until the caller's deadline (and at most the
per-read timeout): name resolution, connecting, a proxy tunnel, the TLS handshake, sending,
the status line and headers, the body, an error body and every redirect hop. So a server that
sends its headers or its error body one byte at a time cannot hold a tool call past its deadline.

Redirects are followed here, not by a library: each hop's target passes the address policy
(addresses.py) before any connection, and on a hop to another origin every header the caller set
is dropped except the harmless ones in SAFE_HEADERS (API keys, Authorization, cookies and any
other configured key header never leave the origin they were meant for).

Connections are kept alive and reused per (scheme, host, port, proxy): tools make many small
calls, and a new connection per call would leave thousands of sockets in TIME_WAIT per step.
"""
from __future__ import annotations

import base64
import collections
import dataclasses
import http.client
import io
import math
import socket
import ssl
import threading
import time
import urllib.request
import zlib
from typing import Mapping
from urllib.parse import unquote, urljoin, urlsplit

from matpo_jax.tools.addresses import AddressPolicy, BlockedUrl, Target, origin, resolve

# Failure kinds (the clients' metrics keys).
CONNECTION_ERROR = "connection_error"  # refused, reset, dropped mid-response, unresolvable
TIMEOUT = "timeout"  # the deadline or a per-read timeout passed
PROTOCOL_ERROR = "protocol_error"  # not HTTP, bad chunking, corrupt or unknown content encoding
BLOCKED_URL = "blocked_url"  # the address policy refused the URL or a redirect target
TOO_MANY_REDIRECTS = "too_many_redirects"

REDIRECT_STATUSES = (301, 302, 303, 307, 308)
# The only caller headers that follow a redirect to another origin.
SAFE_HEADERS = frozenset({"accept", "accept-language", "content-type", "user-agent"})
ERROR_BODY_BYTES = 4096  # what is read of a 4xx/5xx body (for its error message)
USER_AGENT = "matpo-jax-tools/0.1"


class TransportError(Exception):
    """A failed request: `kind` is a metrics key, the message is shown to the model."""

    def __init__(self, kind: str, message: str, retryable: bool):
        super().__init__(message)
        self.kind, self.message, self.retryable = kind, message, retryable


@dataclasses.dataclass(frozen=True)
class Response:
    url: str  # after redirects
    status: int
    headers: Mapping[str, str]  # lower-case names
    body: bytes  # decoded (gzip/deflate), at most the byte cap
    capped: bool  # reading stopped at the byte cap
    redirects: int

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")


@dataclasses.dataclass(frozen=True)
class Limits:
    deadline: float  # time.monotonic() by which the request must be over
    connect_timeout_s: float = 3.0
    read_timeout_s: float = 15.0  # per socket operation
    max_bytes: int = 2_000_000  # body bytes kept (after decoding)
    max_redirects: int = 5

    def remaining(self) -> float:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("deadline passed")
        return remaining


# ============================================================================ sockets and connections
class _DeadlineSocket:
    """A connected socket whose every read and write waits at most min(read timeout, time left
    to the deadline). The deadline is set per request (connections are reused)."""

    def __init__(self, sock: socket.socket, read_timeout_s: float, deadline: float):
        self._sock, self.read_timeout_s, self.deadline = sock, read_timeout_s, deadline
        # As socket.socket does: close() waits for the readers made by makefile(). http.client
        # closes the connection as soon as it sees a response that ends it (HTTP/1.0,
        # Connection: close) and reads that response's body after (EBADF otherwise).
        self._readers, self._closed = 0, False

    def _arm(self) -> None:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("deadline passed")
        self._sock.settimeout(min(self.read_timeout_s, remaining))

    def recv_into(self, buffer, nbytes: int = 0, flags: int = 0) -> int:
        self._arm()
        return self._sock.recv_into(buffer, nbytes, flags)

    def sendall(self, data, flags: int = 0) -> None:
        self._arm()  # since Python 3.5 the timeout bounds the whole sendall
        self._sock.sendall(data, flags)

    def makefile(self, mode: str = "rb", buffering: int = -1, **_) -> io.BufferedReader:
        # What http.client reads responses from: every read ends up in recv_into above.
        self._readers += 1
        return io.BufferedReader(socket.SocketIO(self, "rb"))

    def _decref_socketios(self) -> None:  # socket.SocketIO's close() calls it
        self._readers = max(0, self._readers - 1)
        if self._closed and not self._readers:
            self._sock.close()

    def fileno(self) -> int:
        return self._sock.fileno()

    def close(self) -> None:
        self._closed = True
        if not self._readers:
            self._sock.close()


class _Connection(http.client.HTTPConnection):
    """An http.client connection whose socket is opened by the transport (never by itself)."""

    def __init__(self, transport: "HttpTransport", target: Target, proxy: str | None,
                 limits: Limits):
        super().__init__(target.host, target.port)
        self.transport, self.target, self.proxy, self.limits = transport, target, proxy, limits
        self.last_used = time.monotonic()

    def connect(self) -> None:
        self.sock = self.transport._open(self.target, self.proxy, self.limits)

    def set_deadline(self, limits: Limits) -> None:
        self.limits = limits
        if self.sock is not None:
            self.sock.deadline, self.sock.read_timeout_s = limits.deadline, limits.read_timeout_s


_TLS_CONTEXT: ssl.SSLContext | None = None
_TLS_LOCK = threading.Lock()


def _tls_context() -> ssl.SSLContext:
    global _TLS_CONTEXT
    with _TLS_LOCK:
        if _TLS_CONTEXT is None:
            try:
                import certifi  # the CA bundle requests uses, where the system has none
                _TLS_CONTEXT = ssl.create_default_context(cafile=certifi.where())
            except ImportError:
                _TLS_CONTEXT = ssl.create_default_context()
        return _TLS_CONTEXT


def _proxy_for(target: Target) -> str | None:
    """The environment's proxy for this target (HTTP_PROXY / HTTPS_PROXY, minus NO_PROXY);
    never for direct targets (loopback, private, localhost)."""
    if target.direct:
        return None
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(target.scheme)
    if not proxy or urllib.request.proxy_bypass_environment(target.host, proxies):
        return None
    return proxy if "://" in proxy else "http://" + proxy


def _proxy_authorization(proxy: str) -> dict[str, str]:
    parts = urlsplit(proxy)
    if parts.username is None:
        return {}
    token = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
    return {"Proxy-Authorization": "Basic " + base64.b64encode(token).decode()}


class _Decoder:
    """Content-Encoding gzip/deflate decoded incrementally, never past the byte cap (a small
    compressed body cannot expand into gigabytes here)."""

    def __init__(self, encoding: str):
        encoding = encoding.strip().lower()
        if encoding in ("", "identity"):
            self._zlib = None
        elif encoding in ("gzip", "x-gzip", "deflate"):
            self._zlib = zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib header
        else:
            raise TransportError(PROTOCOL_ERROR, f"unsupported content encoding {encoding!r}",
                                 retryable=False)

    def decode(self, data: bytes, room: int) -> bytes:
        if self._zlib is None:
            return data[:room]
        try:
            return self._zlib.decompress(data, room)  # output at most `room` bytes
        except zlib.error:
            raise TransportError(PROTOCOL_ERROR, "the response's compressed body is corrupt",
                                 retryable=True) from None


# ============================================================================ the transport
class HttpTransport:
    """Deadline-bounded requests with policy-checked redirects and a keep-alive pool.
    Thread-safe: one transport serves every client of a toolbox."""

    def __init__(self, policy: AddressPolicy | None = None, *, pool_size: int = 64,
                 idle_s: float = 10.0):
        """idle_s: pooled connections unused this long are closed rather than reused (keep it
        below the servers' idle timeout: a connection they closed fails on reuse)."""
        self.policy = policy or AddressPolicy()
        self.pool_size, self.idle_s = pool_size, idle_s
        self._idle: dict[tuple, collections.deque[_Connection]] = collections.defaultdict(
            collections.deque)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ public
    def request(self, method: str, url: str, limits: Limits, *, body: bytes | None = None,
                headers: Mapping[str, str] | None = None) -> Response:
        """One request (and its redirects) within `limits.deadline`; raises TransportError."""
        headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "gzip, deflate",
                   **dict(headers or {})}
        try:
            for hop in range(limits.max_redirects + 1):
                target = self.policy.check(url, limits.deadline)
                response = self._exchange(method, target, headers, body, limits, hop)
                location = response.headers.get("location")
                if response.status not in REDIRECT_STATUSES or not location:
                    return response
                next_url = urljoin(target.url, location.strip()).split("#", 1)[0]
                if _origin_or_none(next_url) != target.origin:
                    headers = {k: v for k, v in headers.items() if k.lower() in SAFE_HEADERS}
                if response.status == 303 or (response.status in (301, 302) and method == "POST"):
                    method, body = "GET", None
                    headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
                url = next_url
        except BlockedUrl as e:
            raise TransportError(BLOCKED_URL, str(e), retryable=False) from None
        except TimeoutError:
            raise TransportError(TIMEOUT, "no complete response in time", retryable=True) from None
        raise TransportError(TOO_MANY_REDIRECTS, f"more than {limits.max_redirects} redirects",
                             retryable=False)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, collections.defaultdict(collections.deque)
        for connections in idle.values():
            for conn in connections:
                conn.close()

    # ------------------------------------------------------------------ one hop
    def _exchange(self, method, target: Target, headers, body, limits: Limits,
                  hop: int) -> Response:
        proxy = _proxy_for(target)
        if target.addresses is None and not target.trusted and proxy is None:
            raise TransportError(CONNECTION_ERROR, f"cannot resolve {target.host}", retryable=True)
        request_target = target.path
        send_headers = {**headers, "Host": target.host_header}
        if proxy and target.scheme == "http":  # a plain-HTTP proxy gets the absolute URL
            request_target = target.url
            send_headers.update(_proxy_authorization(proxy))
        key = (target.origin, target.addresses, proxy)
        for fresh in (False, True):
            conn = None if fresh else self._take(key)
            reused = conn is not None
            if conn is None:
                conn = _Connection(self, target, proxy, limits)
            conn.set_deadline(limits)
            try:
                conn.request(method, request_target, body=body, headers=send_headers)
                resp = conn.getresponse()
                return self._read(conn, key, resp, target, limits, hop)
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                conn.close()
                if reused:  # the server closed this idle connection: one fresh try
                    continue
                raise TransportError(CONNECTION_ERROR,
                                     f"the connection to {target.host} was dropped",
                                     retryable=True) from e
            except TransportError:
                conn.close()
                raise
            except TimeoutError:
                conn.close()
                raise
            except http.client.IncompleteRead:
                conn.close()
                raise TransportError(CONNECTION_ERROR, "the response was cut off",
                                     retryable=True) from None
            except http.client.HTTPException as e:
                conn.close()
                raise TransportError(PROTOCOL_ERROR,
                                     f"malformed HTTP response ({type(e).__name__})",
                                     retryable=True) from None
            except ssl.SSLError as e:
                conn.close()
                raise TransportError(CONNECTION_ERROR, f"TLS failed ({e.reason or e})",
                                     retryable=False) from None
            except OSError as e:
                conn.close()
                raise TransportError(CONNECTION_ERROR, f"cannot connect to {target.host} "
                                     f"({type(e).__name__})", retryable=True) from None
            except ValueError as e:  # http.client refusing a header value
                conn.close()
                raise TransportError(PROTOCOL_ERROR, f"invalid request ({e})",
                                     retryable=False) from None
        raise AssertionError("unreachable")

    def _read(self, conn: _Connection, key, resp: http.client.HTTPResponse, target: Target,
              limits: Limits, hop: int) -> Response:
        headers = {k.lower(): v for k, v in resp.getheaders()}
        # Redirect and error bodies are read only for their first bytes (an error message).
        cap = limits.max_bytes if 200 <= resp.status < 300 else min(limits.max_bytes,
                                                                      ERROR_BODY_BYTES)
        decoder = _Decoder(headers.get("content-encoding", ""))
        chunks, size = [], 0
        while size <= cap:
            raw = resp.read(64 * 1024)
            if not raw:
                break
            data = decoder.decode(raw, cap - size + 1)
            chunks.append(data)
            size += len(data)
        capped = size > cap
        if not capped and resp.length:  # the server closed before its Content-Length was sent
            raise http.client.IncompleteRead(b"", resp.length)
        body = b"".join(chunks)[:cap]
        if resp.isclosed() and not resp.will_close and not capped:
            self._give(key, conn)  # fully read: the connection can carry the next request
        else:
            resp.close()
            conn.close()
        return Response(target.url, resp.status, headers, body, capped, hop)

    # ------------------------------------------------------------------ opening sockets
    def _open(self, target: Target, proxy: str | None, limits: Limits) -> _DeadlineSocket:
        if proxy:
            parts = urlsplit(proxy)
            host, port = parts.hostname or "", parts.port or 80
            addresses = resolve(host, port, limits.deadline)
        else:
            host, port = target.host, target.port
            addresses = list(target.addresses or resolve(host, port, limits.deadline))
        raw = self._connect_any(addresses, port, limits)
        try:
            if proxy and target.scheme == "https":
                self._tunnel(_DeadlineSocket(raw, limits.read_timeout_s, limits.deadline),
                             target, proxy)
            if target.scheme == "https":
                raw.settimeout(min(limits.connect_timeout_s, limits.remaining()))
                raw = _tls_context().wrap_socket(raw, server_hostname=target.host)
        except BaseException:
            raw.close()
            raise
        return _DeadlineSocket(raw, limits.read_timeout_s, limits.deadline)

    @staticmethod
    def _connect_any(addresses, port: int, limits: Limits) -> socket.socket:
        error: OSError = OSError("no address")
        for address in addresses:
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.settimeout(min(limits.connect_timeout_s, limits.remaining()))
                sock.connect((address, port))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return sock
            except TimeoutError:
                sock.close()
                raise
            except OSError as e:
                sock.close()
                error = e
        raise error

    @staticmethod
    def _tunnel(sock: _DeadlineSocket, target: Target, proxy: str) -> None:
        """CONNECT host:port through an HTTP proxy (for https targets)."""
        lines = [f"CONNECT {target.host_header}:{target.port} HTTP/1.1",
                 f"Host: {target.host_header}:{target.port}"]
        lines += [f"{k}: {v}" for k, v in _proxy_authorization(proxy).items()]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        reader = sock.makefile("rb")
        status_line = reader.readline(65537).decode("latin-1")
        while True:  # the proxy's headers, up to the blank line
            line = reader.readline(65537)
            if line in (b"\r\n", b"\n", b""):
                break
        parts = status_line.split(None, 2)
        if len(parts) < 2 or parts[1] != "200":
            raise TransportError(CONNECTION_ERROR,
                                 f"the proxy refused the tunnel ({status_line.strip()!r})",
                                 retryable=False)

    # ------------------------------------------------------------------ the pool
    def _take(self, key) -> _Connection | None:
        with self._lock:
            idle = self._idle.get(key)
            while idle:
                conn = idle.pop()
                if conn.sock is not None and time.monotonic() - conn.last_used < self.idle_s:
                    return conn
                conn.close()
        return None

    def _give(self, key, conn: _Connection) -> None:
        conn.last_used = time.monotonic()
        with self._lock:
            idle = self._idle[key]
            idle.append(conn)
            while len(idle) > self.pool_size:
                idle.popleft().close()


def _origin_or_none(url: str):
    try:
        return origin(url)
    except BlockedUrl:
        return None


def deadline_after(seconds: float) -> float:
    return time.monotonic() + seconds if math.isfinite(seconds) else math.inf
