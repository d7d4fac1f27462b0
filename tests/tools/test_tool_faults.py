"""Tool clients against misbehaving local HTTP servers: every fault becomes a counted ToolResult
within a bounded time, and only transient faults are retried."""
import socket
import time

import pytest

from matpo_jax.tools.clients import (
    BAD_RESPONSE,
    CLIENT_ERROR,
    CONNECTION_ERROR,
    INVALID_JSON,
    SERVER_ERROR,
    TIMEOUT,
    TOO_LARGE,
    HttpPolicy,
    PageReader,
    RetrievalSearch,
    SerperSearch,
)

FAST = HttpPolicy(connect_timeout_s=0.5, read_timeout_s=0.3, deadline_s=3.0, max_retries=2, backoff_s=0.05,
                  max_response_bytes=64 * 1024, max_chars=2000)
WALL_BOUND_S = 10.0  # loose: proves nothing hangs, not a performance claim
SEARCH_OK = {"organic": [{"title": "Lyon", "link": "doc-lyon", "snippet": "A city."}]}
FIVE_MB = 5 * 1024 * 1024


def _timed(tool, **arguments):
    start = time.monotonic()
    result = tool(**arguments)
    elapsed = time.monotonic() - start
    assert elapsed < WALL_BOUND_S, f"tool call took {elapsed:.1f}s"
    return result, elapsed


def _assert_failed(tool, result, kind):
    assert not result.ok and result.error_kind == kind
    assert result.text.startswith(f"Error: {tool.name} failed:")
    assert tool.metrics.snapshot() == {f"{tool.name}/calls": 1, f"{tool.name}/error/{kind}": 1}


def test_server_down_connection_refused():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    search = SerperSearch(f"http://127.0.0.1:{port}", policy=FAST)
    result, _ = _timed(search, query="x")
    _assert_failed(search, result, CONNECTION_ERROR)


def test_500s_then_success_after_retries(scripted_server, respond):
    server = scripted_server(respond(500), respond(503), respond(body=SEARCH_OK))
    search = SerperSearch(server.url, policy=FAST)
    result, _ = _timed(search, query="x")
    assert result.ok and result.text == "1. Lyon (id: \"doc-lyon\")\nA city."
    assert len(server.requests) == 3
    assert search.metrics.snapshot() == {"search/calls": 1, "search/ok": 1}


@pytest.mark.parametrize("status", [500, 502, 429])
def test_permanent_server_errors_give_up_after_bounded_retries(scripted_server, respond, status):
    server = scripted_server(respond(status, body={"error": "overloaded"}))
    search = RetrievalSearch(server.url, policy=FAST)
    result, elapsed = _timed(search, query="x")
    _assert_failed(search, result, SERVER_ERROR)
    assert f"HTTP {status}" in result.text
    assert len(server.requests) == FAST.max_retries + 1
    assert elapsed >= FAST.backoff_s * 3  # it did back off (0.05 + 0.1)


def test_4xx_is_not_retried(scripted_server, respond):
    server = scripted_server(respond(401, body={"error": "bad api key"}))
    search = SerperSearch(server.url, policy=FAST)
    result, _ = _timed(search, query="x")
    _assert_failed(search, result, CLIENT_ERROR)
    assert "HTTP 401" in result.text and "bad api key" in result.text
    assert len(server.requests) == 1


def test_slow_response_beyond_read_timeout(scripted_server, respond):
    server = scripted_server(respond(body=SEARCH_OK, delay_s=2.0))
    search = SerperSearch(server.url, policy=FAST)
    result, elapsed = _timed(search, query="x")
    _assert_failed(search, result, TIMEOUT)
    assert len(server.requests) == FAST.max_retries + 1
    assert elapsed < 3 * (FAST.read_timeout_s + 0.5)  # each attempt cut at the read timeout


def test_trickling_response_is_cut_by_the_deadline(scripted_server):
    def trickle(handler):  # every byte arrives within the read timeout, the whole body never does
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", "100000")
        handler.end_headers()
        for _ in range(1000):
            handler.wfile.write(b" ")
            handler.wfile.flush()
            time.sleep(0.1)

    server = scripted_server(trickle)
    policy = HttpPolicy(read_timeout_s=0.5, deadline_s=1.0, max_retries=2, backoff_s=0.05)
    reader = PageReader(server.url, policy=policy)
    result, elapsed = _timed(reader, id="doc")
    _assert_failed(reader, result, TIMEOUT)
    assert elapsed < 2.5


def test_connection_dropped_mid_body_is_retried(scripted_server, respond):
    def hang_up(handler):
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", "1000")
        handler.end_headers()
        handler.wfile.write(b'{"organic": [')
        handler.close_connection = True

    server = scripted_server(hang_up, respond(body=SEARCH_OK))
    search = SerperSearch(server.url, policy=FAST)
    result, _ = _timed(search, query="x")
    assert result.ok and len(server.requests) == 2


@pytest.mark.parametrize(
    "body, kind",
    [(b"<html>Service Unavailable</html>", INVALID_JSON), (b'{"items": []}', BAD_RESPONSE),
     (b'{"organic": "none"}', BAD_RESPONSE), (b'{"organic": [1, 2]}', BAD_RESPONSE)],
)
def test_invalid_or_unexpected_json_is_not_retried(scripted_server, respond, body, kind):
    server = scripted_server(respond(body=body))
    search = SerperSearch(server.url, policy=FAST)
    result, _ = _timed(search, query="x")
    _assert_failed(search, result, kind)
    assert len(server.requests) == 1


def test_five_megabyte_text_page_is_truncated(scripted_server, respond):
    server = scripted_server(respond(body=b"word " * (FIVE_MB // 5), content_type="text/plain"))
    reader = PageReader(server.url, policy=FAST)
    result, _ = _timed(reader, id="https://example.org/huge")
    assert result.ok and result.truncated and result.error_kind is None
    assert result.text == ("word " * 400)[: FAST.max_chars] + "\n[truncated]"
    assert reader.metrics.snapshot() == {"open/calls": 1, "open/ok": 1, "open/truncated": 1}


def test_five_megabyte_json_page_is_refused(scripted_server, respond):
    page = b'{"id": "d", "title": "T", "contents": "' + b"x" * FIVE_MB + b'"}'
    server = scripted_server(respond(body=page))
    reader = PageReader(server.url, policy=FAST)
    result, _ = _timed(reader, id="d")
    _assert_failed(reader, result, TOO_LARGE)
    assert len(server.requests) == 1


def test_small_json_page_over_the_char_cap_is_cut(scripted_server, respond):
    server = scripted_server(respond(body={"id": "d", "title": "T", "contents": "y" * 5000}))
    reader = PageReader(server.url, policy=FAST)
    result, _ = _timed(reader, id="d")
    assert result.ok and result.truncated and len(result.text) == FAST.max_chars + len("\n[truncated]")
