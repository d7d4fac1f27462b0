"""`open` on real URLs (direct fetch + trafilatura, PDFs, a Jina-style reader, Serper scrape),
the address policy on the pages the model asks for, and the disk cache of tool results. Every
page is served by a local web server (configured as an allowed local service)."""
import json

import pytest

from fixtures.fault_server import FaultServer, gzip_bomb, huge, redirect, send
from matpo_jax.tools import counts_since
from matpo_jax.tools.addresses import AddressPolicy
from matpo_jax.tools.clients import (BAD_ARGUMENTS, BLOCKED_URL, PROTOCOL_ERROR,
                                     UNSUPPORTED_CONTENT, HttpPolicy, ToolMetrics, worker_toolbox)
from matpo_jax.tools.transport import HttpTransport
from matpo_jax.tools.web import ReaderService, SerperScrape, WebPageReader

POLICY = HttpPolicy(deadline_s=10.0, max_retries=0, max_response_bytes=256 * 1024,
                    max_chars=4000)
ARTICLE = b"""<html><head><title>Lyon - Encyclopedia</title><script>track()</script></head>
<body><nav><a href="/">Home</a> | <a href="/about">About</a> | Login</nav>
<article><h1>Lyon</h1>
<p>Lyon is the third-largest city of France, at the confluence of the Rhone and the Saone.</p>
<p>It was founded by the Romans in 43 BC as Lugdunum and became famous for silk weaving.</p>
</article><footer>Copyright 2024 Example Media. All rights reserved.</footer></body></html>"""


def make_pdf(text: str) -> bytes:
    """A one-page PDF showing `text`, titled "Test Paper" (objects and xref written by hand)."""
    stream = f"BT /F1 12 Tf 72 712 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Title (Test Paper) >>",
    ]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R /Info 6 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1, xref)
    return bytes(out)


@pytest.fixture(scope="module")
def site():
    routes = {
        "/lyon.html": send(200, ARTICLE, "text/html; charset=utf-8"),
        "/paper.pdf": send(200, make_pdf("Hello PDF world"), "application/pdf"),
        "/notes.txt": send(200, "Plain notes: café.".encode("latin-1"), "text/plain; charset=latin-1"),
        "/huge.html": huge(2_000_000, "text/html"),
        "/logo.png": send(200, b"\x89PNG\r\n\x1a\n" + b"\0" * 64, "image/png"),
        "/bomb": gzip_bomb(),
        "/moved": redirect("/lyon.html", status=301),
        "/missing": send(404, b"<h1>Not found</h1>", "text/html"),
    }
    with FaultServer(routes) as server:
        yield server


@pytest.fixture
def fetch(site):
    return WebPageReader(None, policy=POLICY,
                         transport=HttpTransport(AddressPolicy([site.url])))


def test_html_page_gives_its_main_text(site, fetch):
    url = site.url + "/lyon.html"
    result = fetch(id=url)
    assert result.ok and not result.truncated
    title, _, text = result.text.partition("\n")
    assert title == f'Lyon (id: "{url}")'  # trafilatura drops the site name
    assert "third-largest city of France" in text and "founded by the Romans" in text
    assert "Copyright" not in text and "Login" not in text and "track()" not in text


def test_pdf_plain_text_and_redirects(site, fetch):
    assert fetch(id=site.url + "/paper.pdf").text == (
        f'Test Paper (id: "{site.url}/paper.pdf")\nHello PDF world')
    assert fetch(id=site.url + "/notes.txt").text.endswith("\nPlain notes: café.")
    moved = fetch(id=site.url + "/moved#section")  # the fragment is not sent
    assert moved.ok and "third-largest" in moved.text
    assert site.requests[-1][1] == "/lyon.html"


def test_what_cannot_be_read_is_an_error_text(site, fetch):
    png = fetch(id=site.url + "/logo.png")
    assert png.error_kind == UNSUPPORTED_CONTENT and "cannot read image/png" in png.text
    missing = fetch(id=site.url + "/missing")
    assert missing.error_kind == "client_error" and "HTTP 404" in missing.text
    for not_a_url in ("doc-17", "file:///etc/passwd", "javascript:alert(1)"):
        assert fetch(id=not_a_url).error_kind == BAD_ARGUMENTS
    assert fetch.metrics.snapshot()["open/error/bad_arguments"] == 3


def test_size_caps_hold(site, fetch):
    page = fetch(id=site.url + "/huge.html")
    assert page.ok and page.truncated and len(page.text) == POLICY.max_chars + len("\n[truncated]")
    bomb = fetch(id=site.url + "/bomb")  # 64 MB of zeros in ~64 kB of gzip: decoded up to the cap
    assert bomb.ok and bomb.truncated


def test_local_pages_need_to_be_allowed(site):
    reader = WebPageReader(None, policy=POLICY)  # nothing allowed
    before = len(site.requests)
    result = reader(id=site.url + "/lyon.html")
    assert result.error_kind == BLOCKED_URL and "127.0.0.1 is not a public address" in result.text
    assert len(site.requests) == before


def test_reader_service_and_serper_scrape(site, monkeypatch):
    monkeypatch.setenv("TEST_KEY", "k1")
    with FaultServer({"/https://example.org/a?b=1": send(200, b"Title: A\n\nReader text.",
                                                         "text/plain"),
                      "/": send(200, {"text": "Scraped text.", "metadata": {"title": "A page"}})}
                     ) as service:
        reader = ReaderService(service.url + "/", api_key_env="TEST_KEY", policy=POLICY)
        result = reader(id="https://example.org/a?b=1")
        assert result.text == 'https://example.org/a?b=1 (id: "https://example.org/a?b=1")\nTitle: A\n\nReader text.'
        method, path, headers, _ = service.requests[-1]
        assert (method, path, headers["Authorization"]) == ("GET", "/https://example.org/a?b=1",
                                                            "Bearer k1")
        internal = reader(id="http://127.0.0.1:9/admin")  # the reader would fetch it for us
        assert internal.error_kind == BLOCKED_URL and len(service.requests) == 1

        scrape = SerperScrape(service.url, api_key_env="TEST_KEY", policy=POLICY)
        result = scrape(id="https://example.org/b")
        assert result.text == 'A page (id: "https://example.org/b")\nScraped text.'
        method, path, headers, body = service.requests[-1]
        assert (method, path, headers["X-API-KEY"]) == ("POST", "/", "k1")
        assert json.loads(body) == {"url": "https://example.org/b"}


def test_toolbox_routes_urls_to_the_web_and_ids_to_the_page_service(site, search_server):
    box = worker_toolbox(search_server.url, page_backend="fetch",
                         page_url=search_server.url + "/page", allowed_urls=[site.url])
    assert "third-largest" in box.call("open", {"id": site.url + "/lyon.html"}).text
    assert box.call("open", {"id": "doc-lyon"}).text.startswith('Lyon (id: "doc-lyon")')
    web_only = worker_toolbox(search_server.url, page_backend="fetch")
    assert web_only.call("open", {"id": "doc-lyon"}).error_kind == BAD_ARGUMENTS
    with pytest.raises(ValueError, match="page_backend='scrape'"):
        worker_toolbox(search_server.url, page_backend="scrape")


def test_disk_cache_answers_reruns_and_counts_hits(search_server, tmp_path):
    with FaultServer({"/search": send(200, {"organic": [{"title": "T", "link": "u",
                                                         "snippet": "s"}]}),
                      "/down": send(503, {"error": "overloaded"})}) as service:
        metrics = ToolMetrics()
        box = worker_toolbox(service.url + "/search", cache_dir=str(tmp_path / "cache"),
                             metrics=metrics, policy=HttpPolicy(max_retries=0))
        first = box.call("search", {"query": "Ada  Lovelace"})
        # Same query once normalised (whitespace, the default num): answered from disk.
        second = box.call("search", {"query": " Ada Lovelace", "num": 5})
        assert first == second and first.ok and service.hits("/search") == 1
        assert box.call("search", {"query": "Ada Lovelace", "num": 3}).ok  # another question
        assert service.hits("/search") == 2

        # A resumed run: a new toolbox over the same cache directory pays nothing.
        rerun = worker_toolbox(service.url + "/search", cache_dir=str(tmp_path / "cache"),
                               metrics=metrics)
        before = metrics.snapshot()
        assert rerun.call("search", {"query": "Ada Lovelace"}) == first
        assert service.hits("/search") == 2
        assert counts_since(before, metrics.snapshot()) == {
            "tools/search/calls": 1, "tools/search/ok": 1, "tools/search/cache_hits": 1,
            "tools/cache_hit_rate": 1.0}

        # Failures are not cached; another endpoint is another cache entry.
        failing = worker_toolbox(service.url + "/down", cache_dir=str(tmp_path / "cache"),
                                 metrics=metrics, policy=HttpPolicy(max_retries=0))
        assert not failing.call("search", {"query": "Ada Lovelace"}).ok
        assert not failing.call("search", {"query": "Ada Lovelace"}).ok
        assert service.hits("/down") == 2
    assert metrics.snapshot()["search/cache_hits"] == 2
    assert metrics.cache_hit_rate() == 2 / 6


def test_corrupt_content_encoding_is_a_protocol_error(site, fetch):
    site.routes["/bad-gzip"] = send(200, b"not gzip at all", "text/plain",
                                    {"Content-Encoding": "gzip"})
    site.routes["/brotli"] = send(200, b"x", "text/plain", {"Content-Encoding": "br"})
    assert fetch(id=site.url + "/bad-gzip").error_kind == PROTOCOL_ERROR
    assert fetch(id=site.url + "/brotli").error_kind == PROTOCOL_ERROR
