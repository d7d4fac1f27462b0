"""One deadline per tool call, whatever the server does: slow headers, a trickling error body, a
slow redirect chain, retries. Before: the deadline was checked only between body reads, so slow
headers or a trickling 4xx body blocked a call for minutes."""
import time

import pytest

from fixtures.fault_server import FaultServer, hang, redirect, send, slow_headers, trickle_body
from matpo_jax.tools.clients import (CLIENT_ERROR, TIMEOUT, TOO_MANY_REDIRECTS, HttpPolicy,
                                     PageReader, SerperSearch)

DEADLINE_S = 0.8
SLACK_S = 1.0  # scheduling on a loaded machine; a call that ignored the deadline takes minutes
# Per-read timeouts far above the deadline: only the deadline can end these calls.
POLICY = HttpPolicy(connect_timeout_s=5.0, read_timeout_s=30.0, deadline_s=DEADLINE_S,
                    max_retries=3, backoff_s=0.05)


def _call(tool, **arguments):
    start = time.monotonic()
    result = tool(**arguments)
    elapsed = time.monotonic() - start
    assert elapsed < DEADLINE_S + SLACK_S, f"{tool.name} took {elapsed:.2f}s"
    return result


def _slow(behaviour, delay_s):
    def delayed(handler):
        time.sleep(delay_s)
        behaviour(handler)
    return delayed


@pytest.fixture(scope="module")
def server():
    routes = {
        "/slow-headers": slow_headers(0.05),
        "/trickle-404": trickle_body(404, 0.05),
        "/trickle-200": trickle_body(200, 0.05),
        "/hang": hang(),
        "/loop": redirect("/loop"),
        "/ok": send(200, {"organic": [{"title": "T", "link": "l", "snippet": "s"}]}),
    }
    for hop in range(4):  # a chain of slow redirects, each hop well inside the deadline alone
        routes[f"/chain{hop}"] = _slow(redirect(f"/chain{hop + 1}"), 0.3)
    routes["/chain4"] = routes["/ok"]
    with FaultServer(routes) as s:
        yield s


@pytest.mark.parametrize("path", ["/slow-headers", "/trickle-200", "/hang", "/chain0"])
def test_slow_servers_end_at_the_deadline(server, path):
    search = SerperSearch(server.url + path, policy=POLICY)
    result = _call(search, query="x")
    assert not result.ok and result.error_kind == TIMEOUT
    assert result.text == "Error: search failed: no complete response in time"
    assert search.metrics.snapshot() == {"search/calls": 1, "search/error/timeout": 1}


def test_trickling_error_body_ends_at_the_deadline(server):
    # Before: _error_detail read 2048 bytes of a 4xx body with no deadline at all.
    reader = PageReader(server.url + "/trickle-404", policy=POLICY)
    result = _call(reader, id="doc")
    assert not result.ok and result.error_kind == TIMEOUT
    assert server.hits("/trickle-404") == 1  # not retried past the deadline


def test_error_detail_of_a_normal_4xx_is_kept(server):
    server.routes["/bad-key"] = send(403, {"error": "bad api key\nsecond line"})
    result = _call(SerperSearch(server.url + "/bad-key", policy=POLICY), query="x")
    assert result.error_kind == CLIENT_ERROR
    # A loopback service is named by its path: its port changes from run to run.
    assert result.text.endswith("HTTP 403 from the local service's /bad-key: bad api key second line")


def test_redirect_loops_stop_at_the_hop_limit(server):
    before = server.hits("/loop")
    search = SerperSearch(server.url + "/loop", policy=POLICY)
    result = _call(search, query="x")
    assert result.error_kind == TOO_MANY_REDIRECTS and "more than 5 redirects" in result.text
    assert server.hits("/loop") - before == POLICY.max_redirects + 1  # never retried


def test_fast_redirect_chain_is_followed(server):
    fast = HttpPolicy(deadline_s=5.0)
    for hop in range(4):
        server.routes[f"/fast{hop}"] = redirect(f"/fast{hop + 1}", status=(301, 302, 307, 308)[hop])
    server.routes["/fast4"] = server.routes["/ok"]
    result = SerperSearch(server.url + "/fast0", policy=fast)(query="x")
    assert result.ok and result.text == '1. T (id: "l")\ns'
    methods = [m for m, p, _, _ in server.requests if p.startswith("/fast")]
    # 307/308 keep the POST and its body; 301/302 after a POST become a GET (as browsers do).
    assert methods == ["POST", "GET", "GET", "GET", "GET"]


def test_retries_never_extend_the_deadline(server):
    policy = HttpPolicy(read_timeout_s=0.2, deadline_s=DEADLINE_S, max_retries=50, backoff_s=0.01)
    before = server.hits("/hang")
    result = _call(SerperSearch(server.url + "/hang", policy=policy), query="x")
    assert result.error_kind == TIMEOUT
    assert 1 <= server.hits("/hang") - before <= 5  # a few 0.2 s attempts fit in 0.8 s, not 51


def test_policy_values_are_checked():
    with pytest.raises(ValueError, match="HttpPolicy.deadline_s must be > 0"):
        HttpPolicy(deadline_s=0)
    with pytest.raises(ValueError, match="HttpPolicy.max_retries must be >= 0"):
        HttpPolicy(max_retries=-1)
