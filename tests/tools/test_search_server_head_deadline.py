"""The local search service closes a connection whose request head trickles in: before, the socket
timeout was per read, so a client sending a header byte every 0.2 s held a thread forever."""
import socket
import time

import pytest
import requests

from matpo_jax.tools.search_server import SearchServer

IDLE_S = 1.0


@pytest.fixture(scope="module")
def server(corpus_path):
    with SearchServer(corpus_path, idle_timeout_s=IDLE_S) as s:
        yield s


def trickle(server, head: bytes, every_s: float = 0.2, give_up_s: float = 8.0) -> float:
    """Sends `head` a byte every `every_s` (forever, cycling through it), until the server closes
    the connection; returns how long that took (give_up_s: it never did)."""
    start = time.monotonic()
    with socket.create_connection((server.host, server.port), timeout=every_s) as sock:
        i = 0
        while time.monotonic() - start < give_up_s:
            try:
                sock.sendall(head[i % len(head):i % len(head) + 1])
                if sock.recv(1024) == b"":
                    return time.monotonic() - start
            except socket.timeout:
                pass  # nothing from the server yet: send the next byte
            except (BrokenPipeError, ConnectionResetError):
                return time.monotonic() - start
            i += 1
    return give_up_s


@pytest.mark.parametrize("head", [
    b"POST /search HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000,  # a header that never ends
    b"GET /health HTTP/1.1\r\n" + b"X: y\r\n" * 1000,  # headers that never end
    b"GET /" + b"a" * 1000,  # a request line that never ends
])
def test_a_trickled_request_head_is_closed_at_the_deadline(server, head):
    took = trickle(server, head)
    assert IDLE_S * 0.9 < took < IDLE_S + 1.5, took


def test_requests_on_time_and_keep_alive_still_work(server):
    with requests.Session() as session:
        for _ in range(3):  # one connection, reused across requests
            assert session.get(server.url + "/health", timeout=5).json()["status"] == "ok"
            time.sleep(IDLE_S / 3)  # idle between requests, within the deadline
        found = session.post(server.url + "/search", json={"q": "capital", "num": 2}, timeout=5)
        assert found.status_code == 200 and "organic" in found.json()
