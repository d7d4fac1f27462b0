"""Tool schemas and the HTTP clients behind them.

A rollout must never die because a tool did: every client call returns a ToolResult. Failures
(connection refused, timeouts, 5xx after retries, 4xx, invalid or oversized responses) become a
short error text the model can read, with `ok=False`, and are counted per tool and error kind.

Clients speak three protocols, served locally by `search_server.py` and remotely by real services:
- `SerperSearch`: POST {base}/search {"q", "num"} with header X-API-KEY -> {"organic": [...]}
- `RetrievalSearch`: Search-R1's POST {base}/retrieve {"queries", "topk", "return_scores"}
- `PageReader`: POST {base}/page {"id"} -> {"id", "title", "contents"} (or a text/HTML body)
"""
from __future__ import annotations

import collections
import dataclasses
import inspect
import json
import logging
import os
import re
import threading
import time
from typing import Any, Callable, Mapping, Sequence

import requests
import requests.adapters
import urllib3
from urllib3.exceptions import ReadTimeoutError

from matpo_jax.tools.schemas import OPEN_SCHEMA, SEARCH_SCHEMA
from matpo_jax.chat import (
    MalformedToolCall,
    ToolCall,
    check_arguments,
    parse_tool_call,
    tool_name,
    tool_parameters,
)


# ============================================================================ results and metrics
@dataclasses.dataclass(frozen=True)
class ToolResult:
    """What a tool gives back to the model. `text` is always shown; `error_kind` names a failure."""

    text: str
    ok: bool
    error_kind: str | None = None
    truncated: bool = False  # the text (or the response) was cut at a size cap

    @property
    def error(self) -> str | None:
        return None if self.ok else self.text


# Error kinds (metrics keys): transport, protocol, and the model's own mistakes.
CONNECTION_ERROR = "connection_error"
TIMEOUT = "timeout"
SERVER_ERROR = "server_error"  # 5xx (and 429) still failing after the retries
CLIENT_ERROR = "client_error"  # other 4xx: never retried
INVALID_JSON = "invalid_json"
BAD_RESPONSE = "bad_response"  # valid JSON of an unexpected shape
TOO_LARGE = "too_large"  # a JSON response over the byte cap (unusable once cut)
BAD_ARGUMENTS = "bad_arguments"
UNKNOWN_TOOL = "unknown_tool"
MALFORMED_CALL = "malformed_call"
INTERNAL_ERROR = "internal_error"


class ToolMetrics:
    """Thread-safe counters: "{tool}/calls", "{tool}/ok", "{tool}/truncated", "{tool}/error/{kind}"."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: collections.Counter[str] = collections.Counter()

    def record(self, tool: str, result: ToolResult) -> None:
        with self._lock:
            self._counts[f"{tool}/calls"] += 1
            self._counts[f"{tool}/ok" if result.ok else f"{tool}/error/{result.error_kind}"] += 1
            if result.truncated:
                self._counts[f"{tool}/truncated"] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def errors(self, kind: str | None = None) -> int:
        """Number of failed calls (of one kind, or all)."""
        with self._lock:
            if kind is None:
                return sum(n for key, n in self._counts.items() if "/error/" in key)
            return sum(n for key, n in self._counts.items() if key.endswith(f"/error/{kind}"))


# ============================================================================ HTTP plumbing
@dataclasses.dataclass(frozen=True)
class HttpPolicy:
    """Timeouts, retries and caps shared by the clients."""

    connect_timeout_s: float = 3.0
    read_timeout_s: float = 15.0  # per socket read
    deadline_s: float = 60.0  # whole call incl. retries: a trickling server cannot stall a rollout
    max_retries: int = 2  # extra attempts after the first, on transient failures only
    backoff_s: float = 0.25  # first wait; doubles each retry
    max_response_bytes: int = 2_000_000  # stop reading past this
    max_chars: int = 20_000  # text handed to the model (the paper's tool-response cap)


class ToolFailure(Exception):
    """A failed tool call: `kind` is the metrics key, `message` is shown to the model."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message


class _Retryable(Exception):
    """A failure worth another attempt (transport errors, timeouts, 5xx/429)."""

    def __init__(self, failure: ToolFailure):
        super().__init__(failure.message)
        self.failure = failure


class _Truncated(Exception):
    """Usable text that was cut at the response cap (raised by run() to flag truncation)."""

    def __init__(self, text: str):
        super().__init__("truncated")
        self.text = text


@dataclasses.dataclass(frozen=True)
class _Body:
    data: bytes
    content_type: str
    capped: bool  # reading stopped at max_response_bytes

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")

    def json(self) -> Any:
        if self.capped:
            raise ToolFailure(TOO_LARGE, "the response was larger than the size limit")
        try:
            return json.loads(self.data)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ToolFailure(INVALID_JSON, "the service returned invalid JSON") from None


def _is_transient(status: int) -> bool:
    return status >= 500 or status == 429  # 429: rate limited, worth a later try


def _is_read_timeout(error: BaseException) -> bool:
    while error is not None:
        if isinstance(error, (requests.Timeout, ReadTimeoutError)):
            return True
        error = error.args[0] if error.args and isinstance(error.args[0], BaseException) else None
    return False


def _pooled_session(pool_size: int = 64) -> requests.Session:
    # Many workers call one client concurrently; requests' default pool keeps only 10 connections.
    session = requests.Session()
    adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=pool_size, max_retries=0)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


class HttpTool:
    """Base of the clients: POST JSON with timeouts, bounded retries, a response cap; never raises."""

    name = "tool"

    def __init__(
        self,
        base_url: str,
        policy: HttpPolicy | None = None,
        metrics: ToolMetrics | None = None,
        session: requests.Session | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.policy = policy or HttpPolicy()
        self.metrics = metrics or ToolMetrics()
        self.session = session or _pooled_session()

    def __call__(self, **arguments) -> ToolResult:
        try:
            inspect.signature(self.run).bind(**arguments)
        except TypeError as e:  # a caller that skipped ToolBox validation
            result = ToolResult(f"Error: {self.name}: bad arguments ({e})", False, BAD_ARGUMENTS)
            self.metrics.record(self.name, result)
            return result
        try:
            result = self._finish(self.run(**arguments), truncated=False)
        except _Truncated as t:
            result = self._finish(t.text, truncated=True)
        except ToolFailure as f:
            result = ToolResult(f"Error: {self.name} failed: {f.message}", ok=False, error_kind=f.kind)
        except Exception as e:  # noqa: BLE001 - a tool bug must not kill the rollout either
            logging.getLogger(__name__).exception("%s failed unexpectedly", self.name)
            result = ToolResult(f"Error: {self.name} failed: {type(e).__name__}", False, INTERNAL_ERROR)
        self.metrics.record(self.name, result)
        return result

    def run(self, **arguments) -> str:
        raise NotImplementedError

    def _finish(self, text: str, truncated: bool) -> ToolResult:
        cap = self.policy.max_chars
        if len(text) > cap:
            text, truncated = text[:cap], True
        if truncated:
            text += "\n[truncated]"
        return ToolResult(text, ok=True, truncated=truncated)

    def post(self, path: str, payload: dict, headers: Mapping[str, str] | None = None) -> _Body:
        """POSTs JSON, retrying transient failures with exponential backoff within the deadline."""
        policy = self.policy
        deadline = time.monotonic() + policy.deadline_s
        failure = ToolFailure(INTERNAL_ERROR, "no attempt made")
        for attempt in range(policy.max_retries + 1):
            if attempt:
                wait = policy.backoff_s * 2 ** (attempt - 1)
                if time.monotonic() + wait >= deadline:
                    break
                time.sleep(wait)
            try:
                return self._attempt(path, payload, headers, deadline)
            except _Retryable as r:
                failure = r.failure
        raise failure

    def _attempt(self, path, payload, headers, deadline) -> _Body:
        policy = self.policy
        remaining = max(0.01, deadline - time.monotonic())
        timeout = (min(policy.connect_timeout_s, remaining), min(policy.read_timeout_s, remaining))
        url = self.base_url + path
        try:
            response = self.session.post(
                url, json=payload, headers=dict(headers or {}), timeout=timeout, stream=True
            )
            with response as resp:
                if resp.status_code >= 400:
                    message = f"HTTP {resp.status_code} from {path}"
                    if _is_transient(resp.status_code):
                        raise _Retryable(ToolFailure(SERVER_ERROR, message))
                    raise ToolFailure(CLIENT_ERROR, message + _error_detail(resp))
                return self._read_capped(resp, deadline)
        except requests.ConnectionError as e:
            if _is_read_timeout(e):
                raise _Retryable(ToolFailure(TIMEOUT, f"no response from {path} in time")) from None
            message = f"cannot connect to the {self.name} service"
            raise _Retryable(ToolFailure(CONNECTION_ERROR, message)) from None
        except requests.Timeout:
            raise _Retryable(ToolFailure(TIMEOUT, f"no response from {path} in time")) from None
        except requests.RequestException as e:
            message = f"request failed ({type(e).__name__})"
            raise _Retryable(ToolFailure(CONNECTION_ERROR, message)) from None

    def _read_capped(self, resp: requests.Response, deadline: float) -> _Body:
        cap = self.policy.max_response_bytes
        content_type = resp.headers.get("Content-Type", "")
        chunks, size = [], 0
        while True:
            if time.monotonic() > deadline:
                raise _Retryable(ToolFailure(TIMEOUT, "the response took too long"))
            try:
                # read1: whatever one socket read gives (<= 64 KiB), so a trickling server cannot
                # keep us inside one call past the deadline (iter_content waits for a full chunk).
                chunk = resp.raw.read1(64 * 1024, decode_content=True)
            except ReadTimeoutError:
                raise _Retryable(ToolFailure(TIMEOUT, "the response stalled")) from None
            except urllib3.exceptions.HTTPError as e:  # dropped connection, bad chunking, bad gzip
                message = f"the response was cut off ({type(e).__name__})"
                raise _Retryable(ToolFailure(CONNECTION_ERROR, message)) from None
            if not chunk:
                return _Body(b"".join(chunks), content_type, capped=False)
            chunks.append(chunk)
            size += len(chunk)
            if size > cap:  # stop reading; closing the response drops the rest
                return _Body(b"".join(chunks)[:cap], content_type, capped=True)


def _error_detail(resp: requests.Response) -> str:
    """The service's own short error message, if it sent one as {"error": ...}."""
    try:
        body = resp.raw.read(2048, decode_content=True)
        message = json.loads(body).get("error")
    except Exception:  # noqa: BLE001 - detail is optional
        return ""
    return f": {str(message)[:200]}" if message else ""


def _expect(condition: bool, what: str) -> None:
    if not condition:
        raise ToolFailure(BAD_RESPONSE, f"unexpected response format ({what})")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


# ============================================================================ clients
class SerperSearch(HttpTool):
    """Serper-compatible web search: POST /search {"q", "num"}, key in the X-API-KEY header."""

    name = "search"

    def __init__(
        self, base_url: str, api_key_env: str = "SERPER_API_KEY", default_num: int = 5, **kwargs
    ):
        super().__init__(base_url, **kwargs)
        self.api_key_env, self.default_num = api_key_env, default_num

    def run(self, query: str, num: int | None = None) -> str:
        key = os.environ.get(self.api_key_env)
        headers = {"X-API-KEY": key} if key else {}  # local servers need none
        body = self.post("/search", {"q": query, "num": num or self.default_num}, headers).json()
        _expect(isinstance(body, dict) and isinstance(body.get("organic"), list), "no 'organic' list")
        hits = body["organic"]
        _expect(all(isinstance(h, dict) for h in hits), "'organic' entries must be objects")
        triples = [(h.get("title", ""), h.get("link", ""), h.get("snippet", "")) for h in hits]
        return render_hits(query, triples)


class RetrievalSearch(HttpTool):
    """Search-R1 retriever: POST /retrieve {"queries": [q], "topk": k, "return_scores": true}."""

    name = "search"

    def __init__(self, base_url: str, default_num: int = 3, **kwargs):
        super().__init__(base_url, **kwargs)
        self.default_num = default_num

    def run(self, query: str, num: int | None = None) -> str:
        payload = {"queries": [query], "topk": num or self.default_num, "return_scores": True}
        body = self.post("/retrieve", payload).json()
        result = body.get("result") if isinstance(body, dict) else None
        _expect(isinstance(result, list) and len(result) == 1 and isinstance(result[0], list),
                "'result' must hold one list per query")
        hits = []
        for item in result[0]:
            doc = item.get("document", item) if isinstance(item, dict) else None
            _expect(isinstance(doc, dict) and isinstance(doc.get("contents"), str),
                    "documents need 'contents'")
            title, text = doc.get("title"), doc["contents"]
            if not title:  # Search-R1 corpora put '"Title"\ntext' in contents
                first, _, rest = text.partition("\n")
                title, text = (first.strip('"'), rest) if rest else ("", text)
            hits.append((title, str(doc.get("id", "")), text))
        return render_hits(query, hits)


class PageReader(HttpTool):
    """Page reader for `open`: POST /page {"id"} -> JSON page, or a plain-text/HTML body."""

    name = "open"

    def run(self, id: str) -> str:  # noqa: A002 - the schema's argument name
        body = self.post("/page", {"id": id})
        if "json" in body.content_type:
            page = body.json()
            _expect(isinstance(page, dict) and isinstance(page.get("contents"), str),
                    "page needs 'contents'")
            header = f"{page.get('title') or id} (id: \"{page.get('id', id)}\")"
            return f"{header}\n{page['contents']}"
        text = body.text()
        if "html" in body.content_type:
            text = _html_to_text(text)
        if body.capped:
            raise _Truncated(text)
        return text


def render_hits(query: str, hits: Sequence[tuple[str, str, str]]) -> str:
    """Compact search results: '1. Title (id: "X")\\nsnippet' per hit.

    The id is quoted as the model will quote it in its `open` call, so both tokenize alike (a
    BPE word right after a quote is not the word after a space): copying it is then exact."""
    if not hits:
        return f"No results for {query!r}."
    return "\n".join(
        f"{n}. {_one_line(title)} (id: \"{link}\")\n{_one_line(text)}"
        for n, (title, link, text) in enumerate(hits, 1)
    )


_TAGS = re.compile(r"<script.*?</script>|<style.*?</style>|<[^>]+>", re.DOTALL | re.IGNORECASE)


def _html_to_text(html: str) -> str:
    return re.sub(r"[ \t]*\n\s*", "\n", re.sub(r"[ \t]+", " ", _TAGS.sub(" ", html))).strip()


# ============================================================================ dispatch
class ToolBox:
    """The tools of one role: executes a model's tool call and validates it against the schemas."""

    def __init__(
        self,
        clients: Mapping[str, Callable[..., ToolResult]],
        schemas: Sequence[Mapping[str, Any]],
        metrics: ToolMetrics | None = None,
    ):
        self.schemas = list(schemas)
        self._by_name = {tool_name(s): s for s in self.schemas}
        missing = set(self._by_name) - set(clients)
        if missing:
            raise ValueError(f"ToolBox: no client for tool(s) {sorted(missing)}")
        self.clients = dict(clients)
        self.metrics = metrics or ToolMetrics()  # counts validation failures the clients never see

    @property
    def names(self) -> list[str]:
        return list(self._by_name)

    def call(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """Runs one structured call; unknown tools and bad arguments become error results."""
        if name not in self._by_name:
            message = f"Error: unknown tool {name!r}; available: {self.names}"
            return self._reject(name, UNKNOWN_TOOL, message)
        try:
            check_arguments(name, arguments, tool_parameters(self._by_name[name]))
        except MalformedToolCall as e:
            return self._reject(name, BAD_ARGUMENTS, f"Error: {e.reason}")
        return self.clients[name](**arguments)

    def execute(self, text: str) -> tuple[ToolCall | None, ToolResult]:
        """Parses the tool call in an assistant turn and runs it. A malformed call returns
        (None, error result with error_kind MALFORMED_CALL): a format error, not a tool failure."""
        try:
            call = parse_tool_call(text, self.schemas)
        except MalformedToolCall as e:
            return None, self._reject("call", MALFORMED_CALL, f"Error: invalid tool call ({e.reason}).")
        return call, self.call(call.name, call.arguments)

    def _reject(self, name: str, kind: str, text: str) -> ToolResult:
        result = ToolResult(text, ok=False, error_kind=kind)
        self.metrics.record(name, result)
        return result


def worker_toolbox(
    search_url: str,
    protocol: str = "serper",
    page_url: str | None = None,
    policy: HttpPolicy | None = None,
    metrics: ToolMetrics | None = None,
    **search_kwargs,
) -> ToolBox:
    """`search` + `open` over one service (our search_server serves both), sharing one metrics."""
    metrics = metrics or ToolMetrics()
    search_cls = {"serper": SerperSearch, "retrieval": RetrievalSearch}.get(protocol)
    if search_cls is None:
        raise ValueError(f"protocol={protocol!r}; expected 'serper' or 'retrieval'")
    search = search_cls(search_url, policy=policy, metrics=metrics, **search_kwargs)
    reader = PageReader(page_url or search_url, policy=policy, metrics=metrics)
    return ToolBox({"search": search, "open": reader}, [SEARCH_SCHEMA, OPEN_SCHEMA], metrics)
