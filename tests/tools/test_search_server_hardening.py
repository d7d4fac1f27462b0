"""The local search service against hostile clients, over raw sockets: bodies without a valid
length, text that is not Unicode, too many queries, oversized answers, idle connections; every
error a JSON body. Before: `Content-Length: -1` read until the client hung up (the 1 MB cap
bypassed), a lone surrogate was a 500 (which clients retry), /retrieve took any number of
queries, and an idle connection held its thread forever."""
import http.client
import json
import socket

import pytest

from matpo_jax.tools.clients import CLIENT_ERROR, HttpPolicy, RetrievalSearch, SerperSearch
from matpo_jax.tools.search_server import MAX_QUERIES, MAX_QUERY_CHARS, SearchServer

TIMEOUT_S = 5.0  # a socket wait that ends only if the server answers (or closes)


@pytest.fixture(scope="module")
def server(corpus_path):
    with SearchServer(corpus_path, idle_timeout_s=0.5, max_response_bytes=4000) as s:
        yield s


def _raw(server, data: bytes) -> tuple[int, dict, bool]:
    """Sends raw bytes (without closing our side); returns (status, JSON body, closed after)."""
    with socket.create_connection((server.host, server.port), timeout=TIMEOUT_S) as sock:
        sock.sendall(data)
        response = http.client.HTTPResponse(sock)
        response.begin()
        body = json.loads(response.read())
        closed = response.will_close
        return response.status, body, closed


def _post(server, path, body: bytes, headers: dict):
    conn = http.client.HTTPConnection(server.host, server.port, timeout=TIMEOUT_S)
    conn.putrequest("POST", path, skip_accept_encoding=True)
    for key, value in headers.items():
        conn.putheader(key, value)
    conn.endheaders(body)
    response = conn.getresponse()
    result = response.status, response.getheader("Content-Type"), json.loads(response.read())
    conn.close()
    return result


@pytest.mark.parametrize("length, status, message", [
    ("-1", 400, "invalid Content-Length"),
    ("+12", 400, "invalid Content-Length"),
    ("1e3", 400, "invalid Content-Length"),
    ("99999999999999999999999", 400, "invalid Content-Length"),
    (None, 411, "needs a Content-Length"),
])
def test_post_without_a_valid_length_is_refused_at_once(server, length, status, message):
    header = f"Content-Length: {length}\r\n" if length is not None else ""
    request = (f"POST /search HTTP/1.1\r\nHost: x\r\n{header}\r\n").encode() + b'{"q": "Lyon"}'
    got, body, closed = _raw(server, request)  # we keep sending nothing; no EOF comes from us
    assert (got, closed) == (status, True) and message in body["error"]


def test_chunked_and_conflicting_lengths_are_refused(server):
    chunked = b"POST /search HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    assert _raw(server, chunked)[:1] == (411,)
    twice = b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 13\r\n\r\n{}"
    status, body, closed = _raw(server, twice)
    assert (status, closed) == (400, True) and "invalid Content-Length" in body["error"]


@pytest.mark.parametrize("raw, message", [
    (b'{"q": "caf\xe9"}', "not valid JSON"),  # Latin-1, not UTF-8
    (b'{"q": "\\ud800 Lyon"}', "'q' is not valid Unicode"),  # a lone surrogate escape
    (b'{"q": "Lyon", "num": ' + b"9" * 5000 + b"}", "not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
])
def test_undecodable_text_is_a_400_not_a_500(server, raw, message):
    status, content_type, body = _post(server, "/search", raw,
                                       {"Content-Length": str(len(raw))})
    assert status == 400 and content_type.startswith("application/json")
    assert message in body["error"]


def test_client_does_not_retry_a_refused_query(server):
    search = SerperSearch(server.url, policy=HttpPolicy(max_retries=3, backoff_s=0.01))
    result = search(query="\ud800")
    assert result.error_kind == CLIENT_ERROR and "HTTP 400" in result.text
    assert search.metrics.snapshot() == {"search/calls": 1, "search/error/client_error": 1}


def test_queries_per_request_and_query_length_are_capped(server):
    def retrieve(queries):
        data = json.dumps({"queries": queries, "topk": 1}).encode()
        return _post(server, "/retrieve", data, {"Content-Length": str(len(data))})

    assert retrieve(["Oslo"] * MAX_QUERIES)[0] == 200
    status, _, body = retrieve(["Oslo"] * (MAX_QUERIES + 1))
    assert status == 400 and f"at most {MAX_QUERIES} queries" in body["error"]
    status, _, body = retrieve(["x" * (MAX_QUERY_CHARS + 1)])
    assert status == 400 and f"at most {MAX_QUERY_CHARS} characters" in body["error"]


def test_response_size_is_capped(server):
    ok = RetrievalSearch(server.url, default_num=1)(query="Oslo")
    assert ok.ok  # small answers pass the 4000-byte cap of this server
    data = json.dumps({"queries": ["city company born"] * 20, "topk": 7}).encode()
    status, _, body = _post(server, "/retrieve", data, {"Content-Length": str(len(data))})
    assert status == 400 and "over the cap of 4000" in body["error"]


def test_idle_connections_and_stalled_bodies_are_closed(server):
    with socket.create_connection((server.host, server.port), timeout=TIMEOUT_S) as idle:
        assert idle.recv(1024) == b""  # closed by the server (0.5 s idle), not by our timeout
    stalled = b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"q\": "
    status, body, closed = _raw(server, stalled)
    assert (status, closed) == (408, True) and "not received in time" in body["error"]


@pytest.mark.parametrize("raw, status", [
    (b"GARBAGE\r\n\r\n", 400),
    (b"PUT /search HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 501),
    (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414),
    (b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", 431),
    (b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n", 404),
])
def test_every_error_is_json(server, raw, status):
    got, body, _ = _raw(server, raw)
    assert got == status and isinstance(body["error"], str) and body["error"]


@pytest.mark.parametrize("num", ["²", "٣", "1²", "", " 3", -1, 0, 1.5, True])
def test_a_count_that_is_not_an_ascii_integer_is_a_400_not_a_500(server, num):
    """Issue 48 item 11: "num": "²" (a digit to str.isdigit, not to int) was a 500, which clients
    retry as a server fault; every count that is not an integer in range is the caller's 400."""
    body = json.dumps({"q": "Lyon", "num": num}).encode()
    status, content_type, reply = _post(server, "/search", body, {
        "Content-Type": "application/json", "Content-Length": str(len(body))})
    assert status == 400 and content_type.startswith("application/json")
    assert "field 'num' must be an integer in [1," in reply["error"]
    body = json.dumps({"q": "Lyon", "num": "3"}).encode()  # ASCII digits as text still count
    status, _, reply = _post(server, "/search", body, {
        "Content-Type": "application/json", "Content-Length": str(len(body))})
    assert status == 200 and reply["searchParameters"]["num"] == 3
