"""`open` for real web pages: fetch a URL and extract its main text, or ask a reader service.

Three backends behind the one `open` tool (chosen by `page_backend` in `worker_toolbox`):
- `WebPageReader` ("fetch"): GET the URL here. The address policy refuses non-http(s) URLs and
  non-public addresses after DNS resolution and on every redirect hop; bytes and time are capped
  by the HttpPolicy. HTML -> main text with trafilatura (boilerplate, menus and footers dropped;
  in worker processes the call's deadline ends, main_text.py), PDF -> text with pypdf, text/JSON/XML as is; anything else is refused.
- `ReaderService` ("reader"): a Jina-style reader, GET {reader_url}/{url} -> text
  (e.g. https://r.jina.ai, key in `Authorization: Bearer` from an environment variable).
- `SerperScrape` ("serper_scrape"): POST {"url"} to https://scrape.serper.dev with X-API-KEY
  -> {"text", "metadata": {"title"}}.
`OpenRouter` sends URLs to the web backend and other ids (our local service's page ids) to the
page service, so one `open` serves search results of either kind.
"""
from __future__ import annotations

import io
import os
import re
import time
from typing import Callable
from urllib.parse import urlsplit, urlunsplit

from matpo_jax.tools import redaction
from matpo_jax.tools.addresses import BlockedUrl, parse
from matpo_jax.tools.html_text import html_title_and_text
from matpo_jax.tools.http_tool import (HttpPolicy, HttpTool, Truncated, expect, parse_json,
                                       response_text)
from matpo_jax.tools.main_text import MainTextPool, shared_pool
from matpo_jax.tools.results import (BAD_ARGUMENTS, BAD_RESPONSE, BLOCKED_URL, TOO_LARGE,
                                     UNSUPPORTED_CONTENT, ToolFailure, ToolResult)
from matpo_jax.tools.transport import Response

MAX_PDF_PAGES = 100
# Of a call's deadline, kept for the linear extractor (html_text.py): it takes ~0.25 s a MB on an
# idle core, so the reserve grows with the page and leaves room for a CPU shared 2-3 ways (a page
# at the 2 MB cap with a flat 1 s reserve ran 0.14 s past its deadline on a loaded 2-core CI).
FALLBACK_RESERVE_S = 0.5
FALLBACK_RESERVE_S_PER_MB = 1.0
ACCEPT = "text/html,application/xhtml+xml,application/pdf,text/plain;q=0.9,*/*;q=0.5"
_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/ld+json")


def is_url(text: str) -> bool:
    return isinstance(text, str) and bool(re.match(r"(?i)^https?://", text.strip()))


def normalise_url(url: str) -> str:
    """The URL as fetched and cached: no fragment, lower-case scheme and host."""
    parts = urlsplit(url.strip())
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), parts.path or "/",
                       parts.query, ""))


def _checked_url(text: str) -> str:
    if not is_url(text):
        raise ToolFailure(BAD_ARGUMENTS, f"open needs an http(s) URL from the search results, "
                                         f"got {text[:100]!r}")
    url = normalise_url(text)
    try:
        parse(url)
    except BlockedUrl as e:
        raise ToolFailure(BLOCKED_URL, str(e)) from None
    return url


def _refuse_internal(tool: HttpTool, target: str) -> None:
    """A reader service next to this host could read internal pages for the model: the page URL
    passes the same address policy as a direct fetch (a name that does not resolve here is left
    to the reader)."""
    try:
        tool.transport.policy.check(target, time.monotonic() + tool.policy.connect_timeout_s)
    except BlockedUrl as e:
        raise ToolFailure(BLOCKED_URL, str(e)) from None
    except TimeoutError:
        pass


def _url_arguments(arguments):
    """Cache key arguments of the URL readers: the URL as fetched."""
    page = arguments["id"]
    return {"id": normalise_url(page) if is_url(page) else page}


# ============================================================================ documents -> text
def extract_html(html: str, url: str | None = None, deadline: float | None = None,
                 pool: MainTextPool | None = None) -> tuple[str, str]:
    """(title, main text) of an HTML page: trafilatura in a worker process until `deadline`
    (time.monotonic(); None: the default HttpPolicy's deadline from now), or every visible word
    when it finds no main text (very short pages) or is not done in time."""
    if deadline is None:
        deadline = time.monotonic() + HttpPolicy().deadline_s
    # The fallback's time is kept out of trafilatura's.
    reserve = FALLBACK_RESERVE_S + FALLBACK_RESERVE_S_PER_MB * len(html) / 1e6
    title, text = (pool or shared_pool()).extract(html, url, deadline - reserve) or ("", "")
    if not title or not text.strip():
        page_title, words = html_title_and_text(html)
        title, text = title or page_title, text if text.strip() else words
    return " ".join(title.split()), text.strip()


def extract_pdf(data: bytes) -> tuple[str, str]:
    """(title, text) of a PDF (its first MAX_PDF_PAGES pages)."""
    import pypdf

    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        pages = [page.extract_text() or "" for page in reader.pages[:MAX_PDF_PAGES]]
        title = str((reader.metadata or {}).get("/Title") or "")
    except Exception as e:  # noqa: BLE001 - pypdf raises many kinds on broken files
        raise ToolFailure(BAD_RESPONSE, f"the PDF could not be read ({type(e).__name__})") from None
    return " ".join(title.split()), "\n\n".join(p.strip() for p in pages if p.strip())


def page_text(response: Response, shown_id: str, deadline: float | None = None,
              pool: MainTextPool | None = None) -> str:
    """The page as the model reads it: 'Title (id: "URL")\\ntext'; HTML extracted until
    `deadline` (see extract_html). Raises Truncated for text cut at the byte cap, ToolFailure for
    what cannot be read."""
    content_type = response.content_type.split(";")[0].strip().lower()
    if content_type == "application/pdf" or response.body.startswith(b"%PDF-"):
        if response.capped:
            raise ToolFailure(TOO_LARGE, "the PDF is larger than the size limit")
        title, text = extract_pdf(response.body)
    elif content_type in ("text/html", "application/xhtml+xml") or (
            not content_type and response.body.lstrip()[:1] == b"<"):
        title, text = extract_html(response_text(response), response.url, deadline, pool)
    elif content_type.startswith(_TEXT_TYPES) or not content_type:
        title, text = "", response_text(response)
    else:
        raise ToolFailure(UNSUPPORTED_CONTENT, f"cannot read {content_type} content")
    page = f"{title or shown_id} (id: \"{shown_id}\")\n{text}"
    if response.capped:
        raise Truncated(page)
    return page


# ============================================================================ the backends
class WebPageReader(HttpTool):
    """`open` by fetching the URL here (backend "fetch")."""

    name = "open"

    def __init__(self, *args, pool: MainTextPool | None = None, **kwargs):
        """pool: the worker processes extracting main text (default: the process's shared one,
        started now so the first page does not wait for its imports)."""
        super().__init__(*args, **kwargs)
        self.pool = pool or shared_pool()
        self.pool.warm()

    def run(self, id: str) -> str:  # noqa: A002 - the schema's argument name
        deadline = time.monotonic() + self.policy.deadline_s  # fetching and extracting, together
        url = _checked_url(id)
        response = self.request("GET", url, headers={"Accept": ACCEPT})
        return page_text(response, id.strip(), deadline, self.pool)

    def cache_arguments(self, arguments):
        return _url_arguments(arguments)


class ReaderService(HttpTool):
    """`open` through a Jina-style reader (backend "reader"): GET {url}/{page URL} -> text."""

    name = "open"

    def __init__(self, url: str = "https://r.jina.ai", api_key_env: str | None = "JINA_API_KEY",
                 **kwargs):
        super().__init__(url, **kwargs)
        self.api_key_env = api_key_env
        redaction.register(api_key_env)  # its value never reaches the model or a log

    def run(self, id: str) -> str:  # noqa: A002
        target = _checked_url(id)
        _refuse_internal(self, target)
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        headers = {"Accept": "text/plain"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        response = self.request("GET", self.url.rstrip("/") + "/" + target, headers=headers)
        text = response_text(response).strip()
        page = f"{id.strip()} (id: \"{id.strip()}\")\n{text}"
        if response.capped:
            raise Truncated(page)
        return page

    def cache_arguments(self, arguments):
        return _url_arguments(arguments)


class SerperScrape(HttpTool):
    """`open` through Serper's scrape API (backend "serper_scrape"): POST {"url"} -> {"text"}."""

    name = "open"

    def __init__(self, url: str = "https://scrape.serper.dev",
                 api_key_env: str = "SERPER_API_KEY", **kwargs):
        super().__init__(url, **kwargs)
        self.api_key_env = api_key_env
        redaction.register(api_key_env)  # its value never reaches the model or a log

    def run(self, id: str) -> str:  # noqa: A002
        target = _checked_url(id)
        _refuse_internal(self, target)
        key = os.environ.get(self.api_key_env)
        body = parse_json(self.post({"url": target}, {"X-API-KEY": key} if key else {}))
        expect(isinstance(body, dict) and isinstance(body.get("text"), str), "no 'text'")
        metadata = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
        title = " ".join(str(metadata.get("title") or "").split())
        return f"{title or id.strip()} (id: \"{id.strip()}\")\n{body['text'].strip()}"

    def cache_arguments(self, arguments):
        return _url_arguments(arguments)


class OpenRouter:
    """The `open` tool over a web backend (URLs) and a page service (every other id)."""

    name = "open"

    def __init__(self, web: Callable[..., ToolResult] | None,
                 pages: Callable[..., ToolResult] | None):
        if web is None and pages is None:
            raise ValueError("OpenRouter needs a web backend, a page service or both")
        self.web, self.pages = web, pages

    def __call__(self, id: str) -> ToolResult:  # noqa: A002
        if self.pages is not None and (self.web is None or not is_url(id)):
            return self.pages(id=id)
        return self.web(id=id)  # a non-URL id: an error result, counted by the backend


def make_web_reader(backend: str, *, reader_url: str | None = None,
                    reader_key_env: str | None = None, **kwargs) -> HttpTool:
    """The web backend of `open`: "fetch", "reader" or "serper_scrape" (see the module doc)."""
    if backend == "fetch":
        return WebPageReader(None, **kwargs)
    if backend == "reader":
        return ReaderService(reader_url or "https://r.jina.ai",
                             api_key_env=reader_key_env or "JINA_API_KEY", **kwargs)
    if backend == "serper_scrape":
        return SerperScrape(reader_url or "https://scrape.serper.dev",
                            api_key_env=reader_key_env or "SERPER_API_KEY", **kwargs)
    raise ValueError(f"page_backend={backend!r}; expected one of {PAGE_BACKENDS}")


PAGE_BACKENDS = ("service", "fetch", "reader", "serper_scrape")
__all__ = ["WebPageReader", "ReaderService", "SerperScrape", "OpenRouter", "make_web_reader",
           "PAGE_BACKENDS", "extract_html", "extract_pdf", "is_url"]
