"""The rollout engine under faulty tools: a tool that never returns becomes an error text after
`tool_timeout_s` (the engine never waits on a tool without a bound), a slow HTTP service ends
each call at the client's deadline, and the tool counters reach the batch metrics."""
from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from matpo_jax import tools
from matpo_jax.agents.rollout import FINISH_REASONS, EngineOptions
from matpo_jax.agents.rollout_metrics import rollout_stats
from matpo_jax.agents.trajectory import WORKER

from rollout_scenarios import ADA, BASE


class StuckSearch:
    """A toolbox whose `search` blocks until released (a hung client); `open` works."""

    def __init__(self, real):
        self.real, self.metrics = real, real.metrics
        self.release = threading.Event()
        self.finished = 0

    def call(self, name, arguments):
        if name == "search":
            self.release.wait(60)
            self.finished += 1
        return self.real.call(name, arguments)


def _well_formed(batch):
    for r in batch.rollouts:
        assert r.finish_reason in FINISH_REASONS
        assert len(r.tokens) == len(r.trainable) == len(r.logprobs) <= BASE.max_context
    assert batch.metrics["errors"] == 0


@pytest.mark.parametrize("async_tools", [False, True], ids=["tools waited for", "async tools"])
def test_a_tool_that_never_returns_becomes_an_error_text(rollout, toolbox, async_tools):
    stuck = StuckSearch(toolbox)
    try:
        batch = rollout([ADA.question], toolbox=stuck, async_tools=async_tools,
                        tool_timeout_s=0.5)
        assert stuck.finished == 0  # the batch ended while the search was still hanging
    finally:
        stuck.release.set()
    _well_formed(batch)
    searches = [c for r in batch.by_role(WORKER) for c in r.tool_calls if c.name == "search"]
    assert searches and all(c.tool_failed for c in searches)
    assert searches[0].error == "Error: search failed: no result within 0.5 s"
    assert batch.metrics["tool_timeouts"] == len(searches) == rollout_stats(batch.rollouts)["tool_failures"]


class SlowHeaders(BaseHTTPRequestHandler):
    """Every POST: a status line, then one header byte per 50 ms (for 20 s)."""

    def do_POST(self):
        try:
            self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            for _ in range(400):
                self.wfile.write(b"a")
                self.wfile.flush()
                time.sleep(0.05)
        except OSError:  # the client gave up at its deadline
            pass

    def log_message(self, *args):
        pass


def test_slow_service_calls_end_at_the_client_deadline_and_are_counted(rollout, search_server):
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowHeaders)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        policy = tools.HttpPolicy(read_timeout_s=30.0, deadline_s=0.5, max_retries=1)
        slow = tools.worker_toolbox(f"http://127.0.0.1:{server.server_port}/search",
                                    page_url=search_server.url + "/page", policy=policy)
        batch = rollout([ADA.question], toolbox=slow, async_tools=True, tool_timeout_s=30.0)
    finally:
        server.shutdown()
        server.server_close()
    _well_formed(batch)
    searches = [c for r in batch.by_role(WORKER) for c in r.tool_calls if c.name == "search"]
    assert searches and all(c.error == "Error: search failed: no complete response in time"
                            for c in searches)
    assert batch.metrics["tool_timeouts"] == 0  # the client's own deadline came first
    assert batch.metrics["tools/search/calls"] == len(searches)
    assert batch.metrics["tools/search/error/timeout"] == len(searches)


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "5"])
def test_tool_timeout_must_be_a_finite_positive_number(bad):
    with pytest.raises(ValueError, match="tool_timeout_s must be a positive number"):
        EngineOptions(tool_timeout_s=bad)
