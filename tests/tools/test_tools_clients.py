"""Tool clients against the real local search service (both protocols + open) and the ToolBox."""
import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from matpo_jax.tools.schemas import OPEN_SCHEMA, SEARCH_SCHEMA, SUBAGENT_SCHEMA
from matpo_jax.tools.clients import (
    BAD_ARGUMENTS,
    CLIENT_ERROR,
    INTERNAL_ERROR,
    MALFORMED_CALL,
    UNKNOWN_TOOL,
    HttpPolicy,
    PageReader,
    RetrievalSearch,
    SerperSearch,
    ToolBox,
    ToolMetrics,
    worker_toolbox,
)
from matpo_jax.chat import ToolCall, format_tool_call


def test_schemas_are_openai_function_format():
    for schema, name, required in [(SEARCH_SCHEMA, "search", ["query"]), (OPEN_SCHEMA, "open", ["id"]),
                                   (SUBAGENT_SCHEMA, "subagent", ["subtask"])]:
        assert schema["type"] == "function"
        fn = schema["function"]
        assert fn["name"] == name and fn["description"]
        assert fn["parameters"]["type"] == "object" and fn["parameters"]["required"] == required
    assert SEARCH_SCHEMA["function"]["parameters"]["properties"]["num"]["type"] == "integer"


def test_serper_client_renders_compact_results(search_server):
    search = SerperSearch(search_server.url)
    result = search(query="where was Bob Tanaka born", num=2)
    assert result.ok and result.error_kind is None and not result.truncated
    lines = result.text.split("\n")
    assert lines[0] == "1. Bob Tanaka (id: \"doc-bob\")"
    assert "born in Kyoto" in lines[1]
    assert lines[2].startswith("2. ") and len(lines) == 4
    assert search.metrics.snapshot() == {"search/calls": 1, "search/ok": 1}


def test_retrieval_client_uses_search_r1_protocol(search_server):
    result = RetrievalSearch(search_server.url, default_num=1)(query="capital of Norway")
    assert result.ok
    assert result.text == "1. Oslo (id: \"doc-oslo\")\nOslo is the capital of Norway and home to many shipping companies."


def test_search_without_hits_says_so(search_server):
    assert SerperSearch(search_server.url)(query="xylophone quasar").text == "No results for 'xylophone quasar'."
    assert RetrievalSearch(search_server.url)(query="xylophone quasar").text == "No results for 'xylophone quasar'."


def test_page_reader_opens_documents_and_reports_missing_ones(search_server):
    reader = PageReader(search_server.url)
    page = reader(id="doc-unicode")
    assert page.ok and page.text == "Zürich Café (id: \"doc-unicode\")\nDas Café in Zürich serves crème brûlée. 日本語のテキスト."
    missing = reader(id="doc-none")
    assert not missing.ok and missing.error_kind == CLIENT_ERROR
    assert "404" in missing.text and "no page with id 'doc-none'" in missing.text
    # The service's port changes from run to run; the text the model reads must not.
    port = search_server.url.rsplit(":", 1)[1].split("/")[0]
    assert port not in missing.text and "127.0.0.1" not in missing.text
    assert "HTTP 404 from the local service's /page:" in missing.text
    assert reader.metrics.snapshot() == {"open/calls": 2, "open/ok": 1, "open/error/client_error": 1}


def test_output_is_capped_to_max_chars(search_server):
    result = PageReader(search_server.url, policy=HttpPolicy(max_chars=20))(id="doc-alice")
    assert result.ok and result.truncated
    assert result.text == "Alice Moreau (id: \"d\n[truncated]"


def test_serper_sends_api_key_from_environment(scripted_server, respond, monkeypatch):
    server = scripted_server(respond(body={"organic": [{"title": "T", "link": "https://x.org/a", "snippet": "s  s"}]}))
    monkeypatch.setenv("MY_SEARCH_KEY", "secret-123")
    result = SerperSearch(server.url, api_key_env="MY_SEARCH_KEY")(query="q", num=4)
    assert result.text == "1. T (id: \"https://x.org/a\")\ns s"
    method, path, headers, body = server.requests[0]
    assert (method, path) == ("POST", "/search")
    assert headers["X-API-KEY"] == "secret-123"
    assert json.loads(body) == {"q": "q", "num": 4}


def test_retrieval_client_reads_titles_from_search_r1_contents(scripted_server, respond):
    hit = {"document": {"id": "17", "contents": '"Lyon"\nLyon is a city.'}, "score": 3.2}
    server = scripted_server(respond(body={"result": [[hit]]}))
    assert RetrievalSearch(server.url)(query="Lyon").text == "1. Lyon (id: \"17\")\nLyon is a city."
    assert json.loads(server.requests[0][3]) == {"queries": ["Lyon"], "topk": 3, "return_scores": True}


def test_page_reader_accepts_plain_text_and_html(scripted_server, respond):
    server = scripted_server(
        respond(body=b"Plain page text.", content_type="text/plain"),
        respond(body=b"<html><script>x()</script><p>Hello <b>world</b></p>\n\n<p>Bye</p></html>",
                content_type="text/html"),
    )
    reader = PageReader(server.url)
    assert reader(id="https://example.org/a").text == "Plain page text."
    assert reader(id="https://example.org/b").text == "Hello world\nBye"


def test_toolbox_executes_validated_calls(search_server):
    box = worker_toolbox(search_server.url)
    assert box.names == ["search", "open"] and box.schemas == [SEARCH_SCHEMA, OPEN_SCHEMA]
    call, result = box.execute("<think>find</think>\n" + format_tool_call("open", {"id": "doc-lyon"}))
    assert call == ToolCall("open", {"id": "doc-lyon"})
    assert result.ok and "Rhone" in result.text

    call, result = box.execute(format_tool_call("subagent", {"subtask": "x"}))
    assert call is None and result.error_kind == MALFORMED_CALL and "unknown tool 'subagent'" in result.text
    assert box.call("search", {"query": "x", "limit": 3}).error_kind == BAD_ARGUMENTS
    assert box.call("scrape", {}).error_kind == UNKNOWN_TOOL
    retrieval = worker_toolbox(search_server.url, protocol="retrieval", metrics=box.metrics)
    assert retrieval.call("search", {"query": "Kyoto temples", "num": 1}).text.startswith("1. Kyoto (id: \"doc-kyoto\")")
    counts = box.metrics.snapshot()
    assert counts["open/ok"] == 1 and counts["search/ok"] == 1
    assert counts["call/error/malformed_call"] == 1
    assert counts["search/error/bad_arguments"] == 1 and counts["scrape/error/unknown_tool"] == 1
    assert box.metrics.errors() == 3 and box.metrics.errors(UNKNOWN_TOOL) == 1


def test_toolbox_requires_a_client_per_schema():
    with pytest.raises(ValueError, match=r"no client for tool\(s\) \['open'\]"):
        ToolBox({"search": lambda **kw: None}, [SEARCH_SCHEMA, OPEN_SCHEMA])
    with pytest.raises(ValueError, match="protocol"):
        worker_toolbox("http://127.0.0.1:1", protocol="bing")


def test_clients_never_raise_on_bad_arguments_or_their_own_bugs(search_server):
    result = SerperSearch(search_server.url)(question="no such argument")
    assert not result.ok and result.error_kind == BAD_ARGUMENTS

    class BrokenReader(PageReader):
        def run(self, id):
            raise KeyError("bug")

    broken = BrokenReader(search_server.url)
    result = broken(id="doc-lyon")
    assert not result.ok and result.error_kind == INTERNAL_ERROR and "KeyError" in result.text
    assert broken.metrics.errors(INTERNAL_ERROR) == 1


def test_clients_are_thread_safe_and_metrics_exact(search_server):
    metrics = ToolMetrics()
    search = SerperSearch(search_server.url, metrics=metrics)
    reader = PageReader(search_server.url, metrics=metrics)

    def work(i):
        return search(query="Alice Moreau", num=1) if i % 2 else reader(id="doc-oslo" if i % 4 else "missing")

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(work, range(64)))
    assert all(r.text.startswith("1. Alice Moreau") for r in results[1::2])
    assert metrics.snapshot() == {
        "search/calls": 32, "search/ok": 32,
        "open/calls": 32, "open/ok": 16, "open/error/client_error": 16,
    }
