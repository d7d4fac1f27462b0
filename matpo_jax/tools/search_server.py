"""A local search service over a JSONL corpus, speaking the HTTP APIs real agents use.

    POST /search    {"q": str, "num": int}                         Serper-style web search
        -> {"searchParameters": {...}, "organic": [{"title", "link", "snippet", "position"}]}
    POST /retrieve  {"queries": [str], "topk": int, "return_scores": bool}   Search-R1 retriever
        -> {"result": [[{"document": {"id", "title", "contents"}, "score"}]]}
           (without scores: {"result": [[{"id", "title", "contents"}]]})
    POST /page {"id": str}  or  GET /page?id=...                   page reader for `open`
        -> {"id", "title", "link", "contents"}
    GET /health -> {"status": "ok", "num_docs": n}

Ranking is BM25 (bm25s) over title + contents. A result's `link` is the document id, so the model
can `open` exactly what it saw.

Every error, ours or the HTTP layer's, is a JSON body {"error": "..."}. Bad requests are 4xx, so
clients do not retry them: a POST without a valid Content-Length (411/400; chunked bodies are
not read), a body over MAX_REQUEST_BYTES (413), text that is not valid UTF-8 or holds lone
surrogates (400), more than MAX_QUERIES queries in one /retrieve or a query over
MAX_QUERY_CHARS (400), a response that would exceed MAX_RESPONSE_BYTES (400: ask for less).
A connection idle for `idle_timeout_s`, or whose request head or body is not received within it
(however slowly its bytes trickle in), is closed.

    python -m matpo_jax.tools.search_server --corpus corpus.jsonl --port 8000
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import bm25s

MAX_REQUEST_BYTES = 1 << 20
MAX_RESULTS = 50
MAX_QUERIES = 32  # per /retrieve request
MAX_QUERY_CHARS = 2000
MAX_RESPONSE_BYTES = 8 << 20
IDLE_TIMEOUT_S = 30.0
SNIPPET_CHARS = 240
_DIGITS = re.compile(r"[0-9]{1,18}")


class SearchCorpusError(ValueError):
    """A corpus file that cannot be indexed (names the file and line)."""


@dataclasses.dataclass(frozen=True)
class Document:
    id: str
    title: str
    contents: str


def load_corpus(path) -> list[Document]:
    """Reads {"id", "title", "contents"} records, one JSON object per line."""
    docs, seen = [], set()
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise SearchCorpusError(f"{path}:{line_no}: invalid JSON ({e.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get("id"), str) or not isinstance(
                record.get("contents"), str
            ):
                raise SearchCorpusError(f"{path}:{line_no}: need string fields 'id' and 'contents'")
            if record["id"] in seen:
                raise SearchCorpusError(f"{path}:{line_no}: duplicate id {record['id']!r}")
            seen.add(record["id"])
            docs.append(Document(record["id"], str(record.get("title") or ""), record["contents"]))
    if not docs:
        raise SearchCorpusError(f"{path}: no documents")
    return docs


class SearchIndex:
    """BM25 over title + contents; thread-safe (bm25s retrieval is guarded by a lock)."""

    def __init__(self, docs: list[Document]):
        self.docs = docs
        self.by_id = {d.id: d for d in docs}
        self._tokenizer = bm25s.tokenization.Tokenizer(stopwords="en")
        corpus_ids = self._tokenizer.tokenize(
            [f"{d.title}\n{d.contents}" for d in docs],
            update_vocab=True, return_as="ids", show_progress=False,
        )
        self._bm25 = bm25s.BM25()
        self._bm25.index(corpus_ids, show_progress=False)
        self._lock = threading.Lock()

    def search(self, query: str, k: int) -> list[tuple[Document, float]]:
        """Top-k documents with a positive score (documents sharing no term are not results)."""
        k = max(0, min(k, len(self.docs)))
        if k == 0 or not query.strip():
            return []
        with self._lock:
            query_ids = self._tokenizer.tokenize(
                [query], update_vocab=False, return_as="ids", show_progress=False
            )
            indices, scores = self._bm25.retrieve(query_ids, k=k, show_progress=False)
        return [(self.docs[int(i)], float(s)) for i, s in zip(indices[0], scores[0]) if s > 0]


_WORD = re.compile(r"\w+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def snippet(contents: str, query: str, max_chars: int = SNIPPET_CHARS) -> str:
    """The sentences sharing most words with the query, in document order, within max_chars."""
    sentences = [s for s in _SENTENCE_END.split(contents) if s]
    terms = {w.lower() for w in _WORD.findall(query)}
    ranked = sorted(
        range(len(sentences)),
        key=lambda i: (-len(terms & {w.lower() for w in _WORD.findall(sentences[i])}), i),
    )
    chosen, used = [], 0
    for i in ranked:
        if used + len(sentences[i]) + 1 > max_chars and chosen:
            continue
        chosen.append(i)
        used += len(sentences[i]) + 1
    text = " ".join(sentences[i] for i in sorted(chosen))
    return text if len(text) <= max_chars else text[: max_chars - 3].rstrip() + "..."


class BadRequest(Exception):
    """close: the connection cannot carry another request (its body was not read)."""

    def __init__(self, status: HTTPStatus, message: str, close: bool = False):
        super().__init__(message)
        self.status, self.message, self.close = status, message, close


class _HeadReader:
    """The handler's rfile, whose readline (the request line and each header line) ends at a
    deadline: the socket timeout alone is per read, so a client sending a header byte every few
    seconds would hold its thread forever. Everything else goes to the buffered reader."""

    def __init__(self, rfile, connection):
        self._rfile, self._connection = rfile, connection
        self.deadline: float | None = None

    def __getattr__(self, name):
        return getattr(self._rfile, name)

    def readline(self, limit: int = -1) -> bytes:
        if self.deadline is None:
            return self._rfile.readline(limit)
        parts, size = [], 0
        while limit < 0 or size < limit:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("request head not received in time")
            self._connection.settimeout(remaining)
            buffered = self._rfile.peek(1)  # at most one recv, under the remaining time
            if not buffered:
                break  # the client closed
            end = buffered.find(b"\n")
            take = len(buffered) if end < 0 else end + 1
            if limit >= 0:
                take = min(take, limit - size)
            parts.append(self._rfile.read(take))  # already buffered: no wait
            size += take
            if parts[-1].endswith(b"\n"):
                break
        return b"".join(parts)


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"
    protocol_version = "HTTP/1.1"  # keep-alive: the clients reuse connections
    disable_nagle_algorithm = True  # headers and body are separate writes: avoid 40 ms ACK stalls

    def setup(self):
        self.timeout = self.server.idle_timeout_s  # every socket read/write; idle keep-alives end
        super().setup()
        self.rfile = _HeadReader(self.rfile, self.connection)

    def handle_one_request(self):
        # The whole head (request line and headers) within idle_timeout_s of waiting for it; a
        # TimeoutError there closes the connection (BaseHTTPRequestHandler).
        self.rfile.deadline = time.monotonic() + self.server.idle_timeout_s
        super().handle_one_request()

    def _head_received(self):
        self.rfile.deadline = None
        self.connection.settimeout(self.server.idle_timeout_s)

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def log_message(self, format, *args):  # noqa: A002 - quiet; rollouts make many requests
        pass

    def send_error(self, code, message=None, explain=None):
        """The HTTP layer's own errors (bad request line, unsupported method, headers too long)
        as JSON too."""
        status = HTTPStatus(code)
        self._head_received()
        if self.request_version == "HTTP/0.9":  # unparsable request line: answer with a status
            self.request_version = "HTTP/1.1"
        self.close_connection = True
        self._send(status, {"error": message or status.phrase}, close=True)

    def _dispatch(self, method: str):
        self._head_received()
        if self.server.latency_s:
            time.sleep(self.server.latency_s)
        url = urlsplit(self.path)
        routes = {
            ("POST", "/search"): self._serper_search,
            ("POST", "/retrieve"): self._retrieve,
            ("POST", "/page"): self._page,
            ("GET", "/page"): self._page,
            ("GET", "/health"): self._health,
        }
        try:
            if method == "POST":
                body = self._read_json()
            else:
                body = {key: values[0] for key, values in parse_qs(url.query).items()}
            handler = routes.get((method, url.path))
            if handler is None:
                known = any(path == url.path for _, path in routes)
                raise BadRequest(
                    HTTPStatus.METHOD_NOT_ALLOWED if known else HTTPStatus.NOT_FOUND,
                    f"{method} {url.path} is not served",
                )
            self._send(HTTPStatus.OK, handler(body))
        except BadRequest as e:
            self._send(e.status, {"error": e.message}, close=e.close)
        except TimeoutError:
            self.close_connection = True  # the body stalled; the client may be gone
            self._send(HTTPStatus.REQUEST_TIMEOUT, {"error": "request body not received in time"},
                       close=True)
        except Exception as e:  # noqa: BLE001 - answer 500 rather than drop the connection
            message = f"internal error ({type(e).__name__})"
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": message}, close=True)

    def _read_json(self) -> dict:
        if self.headers.get("Transfer-Encoding"):
            raise BadRequest(HTTPStatus.LENGTH_REQUIRED,
                             "chunked request bodies are not accepted; send Content-Length",
                             close=True)
        lengths = self.headers.get_all("Content-Length") or []
        if not lengths:
            raise BadRequest(HTTPStatus.LENGTH_REQUIRED, "a POST needs a Content-Length",
                             close=True)
        if len(set(lengths)) != 1 or not _DIGITS.fullmatch(lengths[0].strip()):
            # Negative, non-numeric or conflicting: the body's end is unknown; so is the next
            # request's start.
            raise BadRequest(HTTPStatus.BAD_REQUEST, "invalid Content-Length", close=True)
        length = int(lengths[0])
        if length > MAX_REQUEST_BYTES:
            message = f"request body over {MAX_REQUEST_BYTES} bytes"
            raise BadRequest(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, message, close=True)
        raw = self._read_body(length)
        try:
            body = json.loads(raw or b"{}")
        except (ValueError, RecursionError):  # not JSON, not UTF-8, absurdly nested or long
            raise BadRequest(HTTPStatus.BAD_REQUEST, "request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise BadRequest(HTTPStatus.BAD_REQUEST, "request body must be a JSON object")
        return body

    def _read_body(self, length: int) -> bytes:
        """Exactly `length` bytes, all of them within the idle timeout (a client trickling its
        body one byte at a time does not hold a thread for long)."""
        deadline = time.monotonic() + self.server.idle_timeout_s
        chunks, size = [], 0
        while size < length:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("request body")
            self.connection.settimeout(remaining)
            chunk = self.rfile.read1(min(length - size, 64 * 1024))
            if not chunk:
                raise BadRequest(HTTPStatus.BAD_REQUEST, "request body shorter than its "
                                 "Content-Length", close=True)
            chunks.append(chunk)
            size += len(chunk)
        self.connection.settimeout(self.server.idle_timeout_s)
        return b"".join(chunks)

    def _send(self, status: HTTPStatus, payload: dict, close: bool = False):
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8", errors="replace")
        if status == HTTPStatus.OK and len(data) > self.server.max_response_bytes:
            status = HTTPStatus.BAD_REQUEST
            payload = {"error": f"the response would be {len(data)} bytes, over the cap of "
                                f"{self.server.max_response_bytes}: ask for fewer queries or "
                                "results"}
            data = json.dumps(payload).encode("utf-8")
        if close:
            self.close_connection = True
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        if close:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    # ------------------------------------------------------------------ endpoints
    def _serper_search(self, body: dict) -> dict:
        query = _query(_field(body, "q", str), "q")
        num = _count(body, "num", default=10)
        hits = self.server.index.search(query, num)
        organic = [
            {"title": d.title, "link": d.id, "snippet": snippet(d.contents, query), "position": rank}
            for rank, (d, _) in enumerate(hits, 1)
        ]
        return {"searchParameters": {"q": query, "num": num}, "organic": organic}

    def _retrieve(self, body: dict) -> dict:
        queries = _field(body, "queries", list)
        if not all(isinstance(q, str) for q in queries):
            raise BadRequest(HTTPStatus.BAD_REQUEST, "'queries' must be a list of strings")
        if len(queries) > MAX_QUERIES:
            raise BadRequest(HTTPStatus.BAD_REQUEST,
                             f"at most {MAX_QUERIES} queries per request, got {len(queries)}")
        queries = [_query(q, "queries") for q in queries]
        topk = _count(body, "topk", default=3)
        with_scores = body.get("return_scores", False)
        if not isinstance(with_scores, bool):
            raise BadRequest(HTTPStatus.BAD_REQUEST, "'return_scores' must be a boolean")
        result = []
        for query in queries:
            hits = self.server.index.search(query, topk)
            docs = [{"id": d.id, "title": d.title, "contents": d.contents} for d, _ in hits]
            if with_scores:
                docs = [{"document": doc, "score": score} for doc, (_, score) in zip(docs, hits)]
            result.append(docs)
        return {"result": result}

    def _page(self, body: dict) -> dict:
        doc_id = _text(_field(body, "id", str), "id")
        doc = self.server.index.by_id.get(doc_id)
        if doc is None:
            raise BadRequest(HTTPStatus.NOT_FOUND, f"no page with id {doc_id!r}")
        return {"id": doc.id, "title": doc.title, "link": doc.id, "contents": doc.contents}

    def _health(self, body: dict) -> dict:
        return {"status": "ok", "num_docs": len(self.server.index.docs)}


def _field(body: dict, name: str, kind: type) -> Any:
    if name not in body:
        raise BadRequest(HTTPStatus.BAD_REQUEST, f"missing field {name!r}")
    value = body[name]
    if not isinstance(value, kind):
        raise BadRequest(HTTPStatus.BAD_REQUEST, f"field {name!r} must be a {kind.__name__}")
    return value


def _text(value: str, name: str) -> str:
    """Text that can be answered: lone surrogates ("\\ud800" in JSON) cannot be UTF-8 encoded."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(HTTPStatus.BAD_REQUEST, f"field {name!r} is not valid Unicode") from None
    return value


def _query(value: str, name: str) -> str:
    if len(value) > MAX_QUERY_CHARS:
        raise BadRequest(HTTPStatus.BAD_REQUEST,
                         f"field {name!r}: a query has at most {MAX_QUERY_CHARS} characters")
    return _text(value, name)


def _count(body: dict, name: str, default: int) -> int:
    value = body.get(name, default)
    # query-string values arrive as text; only ASCII digits ("²" is a digit to isdigit, not int)
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_RESULTS:
        message = f"field {name!r} must be an integer in [1, {MAX_RESULTS}]"
        raise BadRequest(HTTPStatus.BAD_REQUEST, message)
    return value


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a stuck client never blocks shutdown
    allow_reuse_address = True
    request_queue_size = 256  # the default 5 drops SYNs under concurrent workers (1 s retransmit stalls)

    def __init__(self, address, index: SearchIndex, latency_s: float = 0.0,
                 idle_timeout_s: float = IDLE_TIMEOUT_S,
                 max_response_bytes: int = MAX_RESPONSE_BYTES):
        super().__init__(address, _Handler)
        self.index = index
        self.latency_s = latency_s
        self.idle_timeout_s = idle_timeout_s
        self.max_response_bytes = max_response_bytes


class SearchServer:
    """The service in a background thread: `with SearchServer(path) as s: requests.post(s.url + ...)`."""

    def __init__(self, corpus_path, port: int = 0, host: str = "127.0.0.1",
                 latency_s: float = 0.0, idle_timeout_s: float = IDLE_TIMEOUT_S,
                 max_response_bytes: int = MAX_RESPONSE_BYTES):
        """latency_s: every request waits this long before it is answered, to stand in for a
        remote search API (benchmarks of rollouts whose tools are slow). idle_timeout_s: a
        connection with no complete request for this long is closed."""
        if latency_s < 0:
            raise ValueError(f"latency_s must be >= 0, got {latency_s}")
        if not idle_timeout_s > 0:
            raise ValueError(f"idle_timeout_s must be > 0, got {idle_timeout_s}")
        if not max_response_bytes > 0:
            raise ValueError(f"max_response_bytes must be > 0, got {max_response_bytes}")
        self.index = SearchIndex(load_corpus(corpus_path))
        # port 0: the OS picks a free port
        self._server = _Server((host, port), self.index, latency_s, idle_timeout_s,
                               max_response_bytes)
        self.host, self.port = self._server.server_address[:2]
        self.url = f"http://{self.host}:{self.port}"
        self._thread: threading.Thread | None = None

    def start(self) -> "SearchServer":
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="search-server",
            daemon=True,
        )
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> "SearchServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True, help="JSONL file of {id, title, contents}")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--latency", type=float, default=0.0,
                        help="seconds every request waits before its answer (emulates a remote API)")
    parser.add_argument("--idle-timeout", type=float, default=IDLE_TIMEOUT_S,
                        help="seconds an idle connection is kept open")
    args = parser.parse_args(argv)
    server = SearchServer(args.corpus, port=args.port, host=args.host, latency_s=args.latency,
                          idle_timeout_s=args.idle_timeout)
    print(f"serving {len(server.index.docs)} documents at {server.url}", flush=True)
    try:
        server._server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server._server.server_close()


if __name__ == "__main__":
    main()
