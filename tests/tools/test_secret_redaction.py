"""API keys read from the environment variables the config names never reach the model or a log:
a service on 127.0.0.1 echoes the key it was sent in its error body, its results and a page, and
the judge's endpoint echoes its bearer token. Before: the tool's error text and the judge's
error carried the key into the model's context, the transcripts and the logs."""
from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from matpo_jax.rl.judge import JudgeConfig, JudgeError, LLMJudge
from matpo_jax.tools.clients import HttpPolicy, SerperSearch
from matpo_jax.tools.redaction import REDACTED

KEY = "sk-test-0123456789abcdef"
JUDGE_KEY = "judge-key-9876543210"


class _Echo(BaseHTTPRequestHandler):
    """Answers with the key it was sent: /search?ok -> results quoting it, else 401 quoting it."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        key = self.headers.get("X-API-KEY") or self.headers.get("Authorization") or ""
        if self.path == "/ok/search":
            status, body = 200, {"organic": [{"title": "t", "link": "l",
                                              "snippet": f"your request had X-API-KEY: {key}"}]}
        else:
            status, body = 401, {"error": f"invalid API key {key}"}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def echo_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_key_echoed_by_the_search_service_never_reaches_the_model(echo_server, monkeypatch):
    monkeypatch.setenv("MATPO_TEST_SEARCH_KEY", KEY)
    policy = HttpPolicy(max_retries=0, deadline_s=5)
    failed = SerperSearch(echo_server + "/bad/search", api_key_env="MATPO_TEST_SEARCH_KEY",
                          policy=policy)(query="q")
    assert not failed.ok and "invalid API key" in failed.text
    assert KEY not in failed.text and REDACTED in failed.text
    found = SerperSearch(echo_server + "/ok/search", api_key_env="MATPO_TEST_SEARCH_KEY",
                         policy=policy)(query="q")
    assert found.ok and KEY not in found.text and f"X-API-KEY: {REDACTED}" in found.text


def test_the_judge_key_is_redacted_from_its_errors_and_from_every_log(echo_server, monkeypatch,
                                                                      caplog):
    monkeypatch.setenv("MATPO_TEST_JUDGE_KEY", JUDGE_KEY)
    judge = LLMJudge(JudgeConfig(base_url=echo_server + "/v1", model="m",
                                 api_key_env="MATPO_TEST_JUDGE_KEY", timeout_s=5, max_retries=0))
    with pytest.raises(JudgeError) as error:
        judge.grade("q", "gold", "prediction")
    assert "invalid API key Bearer" in str(error.value) and JUDGE_KEY not in str(error.value)
    # Any logger, any handler: the message, its arguments and a traceback's text.
    with caplog.at_level(logging.INFO):
        logging.getLogger("some.library").warning("sent %s", JUDGE_KEY)
        try:
            raise RuntimeError(f"server said {JUDGE_KEY}")
        except RuntimeError:
            logging.getLogger("matpo_jax.x").exception("failed with key=%s", JUDGE_KEY)
    text = caplog.text
    assert JUDGE_KEY not in text and text.count(REDACTED) == 3, text


def test_short_values_and_unset_variables_are_left_alone(monkeypatch):
    from matpo_jax.tools import redaction
    monkeypatch.setenv("MATPO_TEST_SHORT", "abc")  # "abc" would blank ordinary words
    monkeypatch.delenv("MATPO_TEST_UNSET", raising=False)
    redaction.register("MATPO_TEST_SHORT", "MATPO_TEST_UNSET")
    assert redaction.redact("abc def") == "abc def"
