"""The clients behind the worker tools, and the ToolBox that runs a model's tool calls.

A rollout must never die because a tool did: every client call returns a ToolResult (see
results.py). Failures (connection refused, timeouts, 5xx after retries, 4xx, invalid or
oversized responses, refused addresses) become a short error text the model can read, with
`ok=False`, and are counted per tool and error kind. Every call has one deadline (http_tool.py,
transport.py).

`search`:
- `SerperSearch`: POST {"q", "num"} with header X-API-KEY to the endpoint
  (https://google.serper.dev/search) -> {"organic": [{"title", "link", "snippet"}]}
- `RetrievalSearch`: Search-R1's POST {"queries", "topk", "return_scores"} (.../retrieve)
`open`:
- `PageReader`: our page service, POST {"id"} (.../page) -> {"id", "title", "contents"}
  (or a text/HTML body)
- web pages by URL: web.py (direct fetch + trafilatura, a Jina-style reader, Serper scrape)

URLs are endpoints, used as given; a bare origin gets the protocol's path (see http_tool.py).
The local search service (search_server.py) speaks all three protocols.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Mapping, Sequence
from urllib.parse import urlsplit

from matpo_jax.chat import (MalformedToolCall, ToolCall, check_arguments, parse_tool_call,
                            tool_name, tool_parameters)
from matpo_jax.tools import redaction
from matpo_jax.tools.addresses import AddressPolicy
from matpo_jax.tools.cache import ToolCache
from matpo_jax.tools.http_tool import (HttpPolicy, HttpTool, Truncated, endpoint_url, expect,
                                       parse_json, response_text)
from matpo_jax.tools.results import (  # noqa: F401 - the error kinds, importable from here
    BAD_ARGUMENTS, BAD_RESPONSE, BLOCKED_URL, CLIENT_ERROR, CONNECTION_ERROR, INTERNAL_ERROR,
    INVALID_JSON, MALFORMED_CALL, PROTOCOL_ERROR, SERVER_ERROR, TIMEOUT, TOO_LARGE,
    TOO_MANY_REDIRECTS, UNKNOWN_TOOL, UNSUPPORTED_CONTENT, ToolFailure, ToolMetrics, ToolResult)
from matpo_jax.tools.schemas import OPEN_SCHEMA, SEARCH_SCHEMA
from matpo_jax.tools.transport import HttpTransport
from matpo_jax.tools.html_text import html_to_text
from matpo_jax.tools.web import PAGE_BACKENDS, OpenRouter, make_web_reader

SEARCH_PROTOCOLS = ("serper", "retrieval")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


# ============================================================================ clients
class SerperSearch(HttpTool):
    """Serper-compatible web search: POST {"q", "num"}, key in the X-API-KEY header (read from
    the environment variable `api_key_env` at each call; it never reaches a config or log)."""

    name = "search"
    default_path = "/search"

    def __init__(self, url: str, api_key_env: str = "SERPER_API_KEY", default_num: int = 5,
                 **kwargs):
        super().__init__(url, **kwargs)
        self.api_key_env, self.default_num = api_key_env, default_num
        redaction.register(api_key_env)  # its value never reaches the model or a log

    def cache_arguments(self, arguments):
        return {"query": arguments["query"], "num": arguments.get("num") or self.default_num}

    def run(self, query: str, num: int | None = None) -> str:
        key = os.environ.get(self.api_key_env)
        headers = {"X-API-KEY": key} if key else {}  # local servers need none
        body = parse_json(self.post({"q": query, "num": num or self.default_num}, headers))
        expect(isinstance(body, dict) and isinstance(body.get("organic"), list), "no 'organic' list")
        hits = body["organic"]
        expect(all(isinstance(h, dict) for h in hits), "'organic' entries must be objects")
        triples = [(h.get("title", ""), h.get("link", ""), h.get("snippet", "")) for h in hits]
        return render_hits(query, triples)


class RetrievalSearch(HttpTool):
    """Search-R1 retriever: POST {"queries": [q], "topk": k, "return_scores": true}."""

    name = "search"
    default_path = "/retrieve"

    def __init__(self, url: str, default_num: int = 3, **kwargs):
        super().__init__(url, **kwargs)
        self.default_num = default_num

    def cache_arguments(self, arguments):
        return {"query": arguments["query"], "num": arguments.get("num") or self.default_num}

    def run(self, query: str, num: int | None = None) -> str:
        payload = {"queries": [query], "topk": num or self.default_num, "return_scores": True}
        body = parse_json(self.post(payload))
        result = body.get("result") if isinstance(body, dict) else None
        expect(isinstance(result, list) and len(result) == 1 and isinstance(result[0], list),
                "'result' must hold one list per query")
        hits = []
        for item in result[0]:
            doc = item.get("document", item) if isinstance(item, dict) else None
            expect(isinstance(doc, dict) and isinstance(doc.get("contents"), str),
                    "documents need 'contents'")
            title, text = doc.get("title"), doc["contents"]
            if not title:  # Search-R1 corpora put '"Title"\ntext' in contents
                first, _, rest = text.partition("\n")
                title, text = (first.strip('"'), rest) if rest else ("", text)
            hits.append((title, str(doc.get("id", "")), text))
        return render_hits(query, hits)


class PageReader(HttpTool):
    """Page service for `open`: POST {"id"} -> JSON page, or a plain-text/HTML body."""

    name = "open"
    default_path = "/page"

    def run(self, id: str) -> str:  # noqa: A002 - the schema's argument name
        body = self.post({"id": id})
        if "json" in body.content_type:
            page = parse_json(body)
            expect(isinstance(page, dict) and isinstance(page.get("contents"), str),
                    "page needs 'contents'")
            header = f"{page.get('title') or id} (id: \"{page.get('id', id)}\")"
            return f"{header}\n{page['contents']}"
        text = response_text(body)
        if "html" in body.content_type:
            text = html_to_text(text)
        if body.capped:
            raise Truncated(text)
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
    *,
    page_backend: str = "service",
    reader_url: str | None = None,
    api_key_env: str = "SERPER_API_KEY",
    reader_key_env: str | None = None,
    num_results: int | None = None,
    cache_dir: str | None = None,
    allowed_urls: Sequence[str] = (),
) -> ToolBox:
    """`search` + `open` for workers and the single agent, sharing one transport (connections,
    address policy), one metrics and one cache.

    search_url: the search endpoint, speaking `protocol` ("serper" or "retrieval").
    page_backend: how `open` reads a page.
      "service": every id goes to the page service at `page_url` (default: /page on the search
        service's host, as our local service serves both): the offline worlds.
      "fetch" | "reader" | "serper_scrape": URLs are read from the web (web.py; `reader_url` and
        `reader_key_env` for the last two); other ids go to the page service only if `page_url`
        is given.
    api_key_env: the environment variable holding the Serper key (search and Serper scrape).
    num_results: results per search when the model does not ask for a number.
    cache_dir: a disk cache of successful results (cache.py); None: no cache.
    allowed_urls: more local services the tools may reach (loopback and private addresses are
      refused otherwise, except the configured endpoints).
    """
    if protocol not in SEARCH_PROTOCOLS:
        raise ValueError(f"protocol={protocol!r}; expected one of {SEARCH_PROTOCOLS}")
    if page_backend not in PAGE_BACKENDS:
        raise ValueError(f"page_backend={page_backend!r}; expected one of {PAGE_BACKENDS}")
    metrics = metrics or ToolMetrics()
    shared = dict(policy=policy, metrics=metrics,
                  transport=HttpTransport(AddressPolicy(allowed_urls)),
                  cache=ToolCache(cache_dir) if cache_dir else None)
    defaults = {} if num_results is None else {"default_num": int(num_results)}
    if protocol == "serper":
        search = SerperSearch(search_url, api_key_env=api_key_env, **defaults, **shared)
    else:
        search = RetrievalSearch(search_url, **defaults, **shared)
    if page_backend == "service":
        page_url = page_url or _origin_of(search_url)
    pages = PageReader(page_url, **shared) if page_url else None
    web = None
    if page_backend != "service":
        web = make_web_reader(page_backend, reader_url=reader_url,
                              reader_key_env=reader_key_env or
                              (api_key_env if page_backend == "serper_scrape" else None),
                              **shared)
    return ToolBox({"search": search, "open": OpenRouter(web, pages)},
                   [SEARCH_SCHEMA, OPEN_SCHEMA], metrics)


def _origin_of(url: str) -> str:
    parts = urlsplit(endpoint_url(url, ""))
    return f"{parts.scheme}://{parts.netloc}"
