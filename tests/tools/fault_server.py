"""A real local HTTP server that misbehaves on purpose, one behaviour per path, for the tool tests.

    with FaultServer({"/slow-headers": slow_headers(0.1), "/ok": send(200, {...})}) as server:
        server.url + "/slow-headers"

Behaviours are functions of the request handler; they may write raw bytes. Every request is
recorded as (method, path, headers, body). Behaviours that never end stop when the server does.
"""
from __future__ import annotations

import gzip
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FaultServer:
    def __init__(self, routes, host: str = "127.0.0.1"):
        self.routes = dict(routes)
        self.requests: list[tuple[str, str, dict, bytes]] = []
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _handle(self):
                length = self.headers.get("Content-Length")
                body = self.rfile.read(int(length)) if length and length.isdigit() else b""
                with server._lock:
                    server.requests.append((self.command, self.path, dict(self.headers), body))
                behaviour = (server.routes.get(self.path)
                             or server.routes.get(self.path.split("?")[0]))
                if behaviour is None:
                    behaviour = send(404, {"error": "no route"})
                try:
                    behaviour(self)
                except OSError:  # the client hung up (deadlines, caps): expected here
                    self.close_connection = True

            do_GET = do_POST = do_CONNECT = _handle

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self._server.fault_server = self
        self.port = self._server.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    def hits(self, path: str) -> int:
        with self._lock:
            return sum(1 for _, p, _, _ in self.requests if p.split("?")[0] == path)

    def __enter__(self) -> "FaultServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _stopping(handler) -> threading.Event:
    return handler.server.fault_server.stopping


def send(status: int = 200, body=b"{}", content_type: str = "application/json",
         headers: dict | None = None):
    """One complete response."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()

    def behaviour(handler):
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(data)

    return behaviour


def redirect(location: str, status: int = 307):
    return send(status, b"", "text/plain", {"Location": location})


def slow_headers(interval_s: float = 0.1):
    """A status line, then one header byte per interval, forever: every read is quick, the
    headers never end."""

    def behaviour(handler):
        handler.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        handler.wfile.flush()
        while not _stopping(handler).wait(interval_s):
            handler.wfile.write(b"a")
            handler.wfile.flush()

    return behaviour


def trickle_body(status: int = 200, interval_s: float = 0.1, content_type="application/json"):
    """Headers at once, then a body that announces 100 kB and sends one byte per interval."""

    def behaviour(handler):
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", "100000")
        handler.end_headers()
        handler.wfile.write(b'{"error": "')
        handler.wfile.flush()
        while not _stopping(handler).wait(interval_s):
            handler.wfile.write(b"x")
            handler.wfile.flush()

    return behaviour


def hang():
    """Reads the request, never answers."""

    def behaviour(handler):
        _stopping(handler).wait(30)

    return behaviour


def drop():
    """Closes the connection without a response."""

    def behaviour(handler):
        handler.close_connection = True
        handler.connection.shutdown(socket.SHUT_RDWR)

    return behaviour


def garbage():
    """Bytes that are not HTTP."""

    def behaviour(handler):
        handler.wfile.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        handler.close_connection = True

    return behaviour


def huge(size: int, content_type: str = "text/plain"):
    return send(200, b"word " * (size // 5), content_type)


def gzip_bomb(expanded: int = 64 << 20):
    """A small gzip body that expands to `expanded` bytes (zeros)."""
    data = gzip.compress(b"\0" * expanded, compresslevel=9)

    def behaviour(handler):
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain")
        handler.send_header("Content-Encoding", "gzip")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    return behaviour
