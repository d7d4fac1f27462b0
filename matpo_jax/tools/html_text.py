"""Every visible word of an HTML page, and its title, in time linear in the page.

A regex over tags (`<script.*?</script>|<[^>]+>`) rescans the rest of the page from every unclosed
`<script` or `<`: 112 kB of `<script` took 12.6 s, holding the GIL (one C call), so every other
thread of the process stopped as long. The stdlib html.parser of Python 3.11.7 has the same
quadratic rescans. libxml2's HTML parser (lxml) reads the page once, repairs what is unclosed, and
releases the GIL while it parses; the tree is then walked one node at a time from Python, so
other threads keep running.
"""
from __future__ import annotations

import lxml.etree
import lxml.html

_INVISIBLE = ("script", "style", "noscript", "template")


def parse_html(html: str):
    """The page's element tree (lxml), or None for a page with no elements."""
    # Bytes, not str: lxml refuses a str that carries an XML encoding declaration.
    data = html.encode("utf-8", errors="replace")
    if not data.strip():
        return None
    parser = lxml.html.HTMLParser(encoding="utf-8", remove_comments=True, remove_pis=True,
                                  no_network=True)  # a parser per call: lxml's are per thread
    try:
        return lxml.etree.fromstring(data, parser)
    except (lxml.etree.ParserError, lxml.etree.XMLSyntaxError, ValueError):
        return None


def normalise_whitespace(text: str) -> str:
    """Runs of spaces and tabs as one space, no blank lines, no spaces around line breaks."""
    lines = (" ".join(line.split()) for line in text.split("\n"))
    return "\n".join(line for line in lines if line)


def _visible_text(root, drop: tuple[str, ...]) -> str:
    lxml.etree.strip_elements(root, *drop, with_tail=False)
    # A tag separates words, as the page shows them: "<b>a</b><i>b</i>" reads "a b".
    return normalise_whitespace(" ".join(root.itertext()))


def html_title(root) -> str:
    """The page's <title>, on one line ("" without one)."""
    title = None if root is None else root.find(".//title")
    return "" if title is None else " ".join(title.text_content().split())


def html_to_text(html: str) -> str:
    """Every visible word of `html` (scripts, styles and comments removed)."""
    root = parse_html(html)
    return "" if root is None else _visible_text(root, _INVISIBLE)


def html_title_and_text(html: str) -> tuple[str, str]:
    """(title, every visible word but the title's), from one parse of `html`."""
    root = parse_html(html)
    if root is None:
        return "", ""
    title = html_title(root)
    return title, _visible_text(root, (*_INVISIBLE, "title"))
