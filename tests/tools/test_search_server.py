"""The local BM25 search service over real HTTP: both search protocols, pages, errors, lifecycle."""
import http.client
import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from matpo_jax.tools.search_server import SearchCorpusError, SearchServer, load_corpus, snippet


def test_serper_protocol_ranks_by_bm25(search_server):
    resp = requests.post(search_server.url + "/search", json={"q": "where was Bob Tanaka born", "num": 2}, timeout=5)
    assert resp.status_code == 200
    body = resp.json()
    assert body["searchParameters"] == {"q": "where was Bob Tanaka born", "num": 2}
    organic = body["organic"]
    assert len(organic) == 2
    assert organic[0]["title"] == "Bob Tanaka" and organic[0]["link"] == "doc-bob"
    assert [hit["position"] for hit in organic] == [1, 2]
    assert "Kyoto" in organic[0]["snippet"]


def test_search_r1_protocol_with_and_without_scores(search_server):
    payload = {"queries": ["capital of Norway", "temples Japan"], "topk": 2, "return_scores": True}
    result = requests.post(search_server.url + "/retrieve", json=payload, timeout=5).json()["result"]
    assert len(result) == 2
    first = result[0][0]
    assert first["document"]["id"] == "doc-oslo"
    assert first["document"]["contents"].startswith("Oslo is the capital")
    assert first["score"] > 0
    scores = [hit["score"] for hit in result[0]]
    assert scores == sorted(scores, reverse=True)
    assert result[1][0]["document"]["id"] == "doc-kyoto"
    plain = requests.post(search_server.url + "/retrieve", json={"queries": ["Kyoto"], "topk": 1}, timeout=5).json()
    assert plain == {"result": [[{"id": "doc-kyoto", "title": "Kyoto",
                                  "contents": "Kyoto is a city in Japan famous for its temples and gardens."}]]}


def test_query_matching_nothing_returns_no_results(search_server):
    body = requests.post(search_server.url + "/search", json={"q": "xylophone quasar"}, timeout=5).json()
    assert body["organic"] == []


def test_page_by_post_and_get_with_unicode(search_server):
    page = requests.post(search_server.url + "/page", json={"id": "doc-unicode"}, timeout=5).json()
    assert page == {"id": "doc-unicode", "title": "Zürich Café", "link": "doc-unicode",
                    "contents": "Das Café in Zürich serves crème brûlée. 日本語のテキスト."}
    assert requests.get(search_server.url + "/page", params={"id": "doc-unicode"}, timeout=5).json() == page


@pytest.mark.parametrize(
    "method, path, kwargs, status, message",
    [
        ("post", "/search", {"data": b"{not json"}, 400, "not valid JSON"),
        ("post", "/search", {"json": ["q"]}, 400, "JSON object"),
        ("post", "/search", {"json": {"num": 3}}, 400, "missing field 'q'"),
        ("post", "/search", {"json": {"q": 5}}, 400, "'q' must be a str"),
        ("post", "/search", {"json": {"q": "x", "num": 0}}, 400, "'num' must be an integer"),
        ("post", "/retrieve", {"json": {"queries": "x"}}, 400, "'queries' must be a list"),
        ("post", "/retrieve", {"json": {"queries": [1]}}, 400, "list of strings"),
        ("post", "/retrieve", {"json": {"queries": ["x"], "return_scores": "yes"}}, 400, "boolean"),
        ("post", "/page", {"json": {"id": "missing-doc"}}, 404, "no page with id 'missing-doc'"),
        ("get", "/page", {}, 400, "missing field 'id'"),
        ("post", "/nowhere", {"json": {}}, 404, "not served"),
        ("get", "/search", {}, 405, "not served"),
    ],
)
def test_bad_requests_get_clean_json_errors(search_server, method, path, kwargs, status, message):
    resp = getattr(requests, method)(search_server.url + path, timeout=5, **kwargs)
    assert resp.status_code == status
    assert resp.headers["Content-Type"].startswith("application/json")
    assert message in resp.json()["error"]


def test_oversized_request_is_rejected_without_reading_it(search_server):
    conn = http.client.HTTPConnection(search_server.host, search_server.port, timeout=5)
    conn.putrequest("POST", "/search")
    conn.putheader("Content-Length", str(1 << 30))  # announced, never sent
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 413 and "request body over" in json.loads(resp.read())["error"]
    conn.close()


def test_concurrent_requests(search_server):
    def query(i):
        q = ["Alice Moreau", "Oslo Norway", "Kyoto temples"][i % 3]
        return requests.post(search_server.url + "/search", json={"q": q, "num": 1}, timeout=5).json()["organic"][0]["link"]

    with ThreadPoolExecutor(8) as pool:
        links = list(pool.map(query, range(48)))
    assert links == ["doc-alice", "doc-oslo", "doc-kyoto"] * 16


def test_context_manager_picks_free_port_and_shuts_down(corpus_path):
    with SearchServer(corpus_path) as server:
        assert server.host == "127.0.0.1" and server.port > 0
        assert requests.get(server.url + "/health", timeout=5).json() == {"status": "ok", "num_docs": 7}
    with pytest.raises(requests.ConnectionError):
        requests.get(server.url + "/health", timeout=2)


def test_corpus_errors_name_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "contents": "x"}\n{"id": "b"}\n')
    with pytest.raises(SearchCorpusError, match=r"bad.jsonl:2: need string fields"):
        load_corpus(bad)
    bad.write_text('{"id": "a", "contents": "x"}\n{"id": "a", "contents": "y"}\n')
    with pytest.raises(SearchCorpusError, match="duplicate id 'a'"):
        load_corpus(bad)
    bad.write_text("not json\n")
    with pytest.raises(SearchCorpusError, match=r":1: invalid JSON"):
        load_corpus(bad)


def test_snippet_prefers_sentences_matching_the_query():
    text = "Filler one. Filler two. Alice was born in Lyon. More filler text."
    assert snippet(text, "Alice born", max_chars=30) == "Alice was born in Lyon."
    assert snippet(text, "x", max_chars=1000) == text


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_command_line_entry_point(corpus_path):
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "matpo_jax.tools.search_server", "--corpus", str(corpus_path), "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
    )
    try:
        line = proc.stdout.readline()  # printed once the socket is listening
        assert f"serving 7 documents at http://127.0.0.1:{port}" in line
        hits = requests.post(f"http://127.0.0.1:{port}/search", json={"q": "Lyon France"}, timeout=5).json()
        assert hits["organic"][0]["link"] == "doc-lyon"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_latency_delays_every_endpoint(corpus_path):
    with SearchServer(corpus_path, latency_s=0.3) as server:
        for request in (lambda: requests.post(server.url + "/search", json={"q": "Lovelace"},
                                              timeout=10),
                        lambda: requests.get(server.url + "/health", timeout=10),
                        lambda: requests.get(server.url + "/nowhere", timeout=10)):
            started = time.perf_counter()
            response = request()
            assert time.perf_counter() - started >= 0.3
            assert response.status_code in (200, 404)
    with pytest.raises(ValueError, match="latency_s must be >= 0"):
        SearchServer(corpus_path, latency_s=-1)
