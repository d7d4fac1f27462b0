"""`open` on hostile HTML (issue 23 item 2): extraction ends within the call's deadline and never
stops the other threads of the process. Pages are served by a local web server."""
import threading
import time

import pytest

from fixtures.fault_server import FaultServer, send
from matpo_jax.tools.addresses import AddressPolicy
from matpo_jax.tools.clients import HttpPolicy
from matpo_jax.tools.html_text import html_title_and_text, html_to_text
from matpo_jax.tools.transport import HttpTransport
from matpo_jax.tools.web import WebPageReader

DEADLINE_S = 5.0
MAX_GAP_S = 0.5  # the longest another thread may wait for the GIL
CAP = 2_000_000  # HttpPolicy's byte cap
PAGES = {
    "/scripts-112k.html": b"<script" * 16000,  # the probe: 12.6 s with the regex extractor
    "/scripts-2mb.html": b"<script" * (CAP // 7),
    "/paragraphs-2mb.html": b"<p>word " * (CAP // 8),  # trafilatura alone: 42 s in-process
}


class Heartbeat:
    """A thread that wakes every millisecond and records the longest it waited."""

    def __enter__(self):
        self.max_gap_s, self._stop = 0.0, threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()
        return self

    def _beat(self):
        while not self._stop.is_set():
            start = time.perf_counter()
            time.sleep(0.001)
            self.max_gap_s = max(self.max_gap_s, time.perf_counter() - start)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


@pytest.fixture(scope="module")
def site():
    routes = {path: send(200, body, "text/html; charset=utf-8") for path, body in PAGES.items()}
    with FaultServer(routes) as server:
        yield server


@pytest.fixture(scope="module")
def reader(site):
    policy = HttpPolicy(deadline_s=DEADLINE_S, max_retries=0, max_response_bytes=CAP)
    return WebPageReader(None, policy=policy, transport=HttpTransport(AddressPolicy([site.url])))


def _open_timed(reader, url):
    with Heartbeat() as beat:
        start = time.monotonic()
        result = reader(id=url)
        elapsed = time.monotonic() - start
    return result, elapsed, beat.max_gap_s


@pytest.mark.parametrize("path", ["/scripts-112k.html", "/scripts-2mb.html"])
def test_unclosed_scripts_extract_within_the_deadline_while_other_threads_run(site, reader, path):
    result, elapsed, gap = _open_timed(reader, site.url + path)
    assert result.ok, result.text
    assert elapsed < DEADLINE_S, f"open took {elapsed:.1f} s"
    assert gap < MAX_GAP_S, f"another thread waited {gap:.2f} s"


def test_a_page_too_slow_for_trafilatura_falls_back_to_its_words_at_the_deadline(site, reader):
    result, elapsed, gap = _open_timed(reader, site.url + "/paragraphs-2mb.html")
    assert elapsed < DEADLINE_S, f"open took {elapsed:.1f} s"
    assert gap < MAX_GAP_S, f"another thread waited {gap:.2f} s"
    assert result.ok and result.truncated and "word word word" in result.text


@pytest.mark.parametrize("page", [
    "<script" * (CAP // 7), "<style" * (CAP // 6), "<title" * (CAP // 6), "<title>" * (CAP // 7),
    "<" * CAP, "<!--" * (CAP // 4), '<a b="' * (CAP // 6), "</a" * (CAP // 3), " " * CAP + "x"])
def test_the_word_extractor_is_linear_in_the_page(page):
    start = time.monotonic()
    html_to_text(page)
    html_title_and_text(page)
    assert time.monotonic() - start < 2.0


def test_the_word_extractor_keeps_words_and_drops_code():
    page = ("<html><head><title>A  page</title><style>p {}</style></head><body><script>x()"
            "</script><p>Hello <b>world</b></p>\n\n<p>Bye<!-- note --></p></body></html>")
    assert html_to_text(page) == "A page Hello world\nBye"
    assert html_title_and_text(page) == ("A page", "Hello world\nBye")
    assert html_to_text("") == html_to_text("   ") == ""
    assert html_to_text('<?xml version="1.0" encoding="latin-1"?><p>café</p>') == "café"
