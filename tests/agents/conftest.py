"""Fixtures for the agent tests: a locally trained tokenizer, a small JSONL corpus, the search
server over it, and tiny scripted HTTP servers for tool-fault tests."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from matpo_jax.agents.search_server import SearchServer
from matpo_jax.tokenizer import ChatFormat
from matpo_jax.tokenizer_training import train_tokenizer

# Enough text that BPE learns real merges for the words the tests use.
TRAINING_TEXTS = [
    "Alice Moreau was born in Lyon. She founded the Northwind Company in 1921.",
    "The Northwind Company is based in Oslo and employs Bob Tanaka as chief engineer.",
    "Search results: 1. Lyon (id: doc-1) A city in France. 2. Oslo (id: doc-2) The capital of Norway.",
    '<tool_call>\n{"name": "search", "arguments": {"query": "founder of Northwind"}}\n</tool_call>',
    '<tool_call>\n{"name": "subagent", "arguments": {"subtask": "Who founded Northwind?"}}\n</tool_call>',
    "<think>I should look for the founder first.</think>\n\nThe answer is \\boxed{Lyon}.",
] * 20

CORPUS = [
    {"id": "doc-alice", "title": "Alice Moreau", "contents": "Alice Moreau was born in Lyon. She founded the Northwind Company in 1921. She liked sailing."},
    {"id": "doc-northwind", "title": "Northwind Company", "contents": "The Northwind Company is a shipping firm based in Oslo. Its founder was Alice Moreau."},
    {"id": "doc-bob", "title": "Bob Tanaka", "contents": "Bob Tanaka is the chief engineer of the Northwind Company. He was born in Kyoto."},
    {"id": "doc-lyon", "title": "Lyon", "contents": "Lyon is a city in France on the Rhone river, known for silk weaving."},
    {"id": "doc-oslo", "title": "Oslo", "contents": "Oslo is the capital of Norway and home to many shipping companies."},
    {"id": "doc-kyoto", "title": "Kyoto", "contents": "Kyoto is a city in Japan famous for its temples and gardens."},
    {"id": "doc-unicode", "title": "Zürich Café", "contents": "Das Café in Zürich serves crème brûlée. 日本語のテキスト."},
]


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(TRAINING_TEXTS, vocab_size=512, out_dir=path)
    return path


@pytest.fixture(scope="session")
def chat_format(tokenizer_dir):
    return ChatFormat.from_pretrained(tokenizer_dir)


@pytest.fixture(scope="session")
def corpus_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps(doc, ensure_ascii=False) + "\n" for doc in CORPUS), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def search_server(corpus_path):
    with SearchServer(corpus_path) as server:
        yield server


# ----------------------------------------------------------------------------- scripted HTTP server
class ScriptedServer:
    """A real local HTTP server whose responses follow a script (one behaviour per request; the last
    repeats). Behaviours are functions of the request handler; `requests` records what came in."""

    def __init__(self, behaviours):
        self.behaviours = list(behaviours)
        self.requests = []  # (method, path, headers, body) per request
        self._lock = threading.Lock()
        script = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                with script._lock:
                    script.requests.append((self.command, self.path, dict(self.headers), body))
                    behaviour = script.behaviours[min(len(script.requests), len(script.behaviours)) - 1]
                try:
                    behaviour(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client hung up (timeouts, size caps): expected in these tests

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _respond(status=200, body=b"{}", content_type="application/json", delay_s=0.0):
    """Behaviour: optionally wait, then send one complete response."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()

    def behaviour(handler):
        time.sleep(delay_s)
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    return behaviour


@pytest.fixture
def respond():
    """Factory of behaviours for scripted_server: respond(status, body, content_type, delay_s)."""
    return _respond


@pytest.fixture
def scripted_server():
    servers = []

    def start(*behaviours):
        server = ScriptedServer(behaviours).__enter__()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.__exit__(None, None, None)
