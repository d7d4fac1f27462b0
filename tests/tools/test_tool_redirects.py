"""Where tool calls may go: key headers never follow a redirect to another origin, redirect
targets pass the address policy, local services are reached without environment proxies,
remote ones through them. Before: a 307 carried X-API-KEY to any host, a redirect to an
internal address was a successful result, and HTTP_PROXY captured calls to 127.0.0.1."""
import json
import socket

import pytest

from fixtures.fault_server import FaultServer, redirect, send
from matpo_jax.tools.addresses import AddressPolicy, BlockedUrl
from matpo_jax.tools.clients import (BLOCKED_URL, CONNECTION_ERROR, HttpPolicy, PageReader,
                                     RetrievalSearch, SerperSearch, worker_toolbox)
from matpo_jax.tools.transport import HttpTransport
from matpo_jax.tools.web import ReaderService

HITS = {"organic": [{"title": "T", "link": "l", "snippet": "s"}]}
FAST = HttpPolicy(connect_timeout_s=1.0, read_timeout_s=2.0, deadline_s=3.0, max_retries=0)
KEY_HEADERS = ("x-api-key", "authorization", "x-custom-key", "cookie")


@pytest.fixture
def servers():
    with FaultServer({"/search": send(200, HITS)}) as other, \
            FaultServer({"/search": send(200, HITS), "/": send(200, b"secret", "text/plain")},
                        host="127.0.0.1") as canary, \
            FaultServer({"/search": send(200, HITS)}) as origin:
        yield origin, other, canary


def _lower(headers):
    return {k.lower(): v for k, v in headers.items()}


def test_redirect_to_another_origin_drops_every_key_header(servers, monkeypatch):
    origin, other, _ = servers
    monkeypatch.setenv("TEST_SEARCH_KEY", "secret-key")
    origin.routes["/moved"] = redirect(other.url.replace("127.0.0.1", "localhost") + "/search")
    origin.routes["/same"] = redirect("/search", status=308)
    transport = HttpTransport(AddressPolicy([other.url.replace("127.0.0.1", "localhost")]))
    search = SerperSearch(origin.url + "/same", api_key_env="TEST_SEARCH_KEY", policy=FAST,
                          transport=transport)
    assert search(query="q").ok  # a redirect within the origin keeps the key
    assert _lower(origin.requests[-1][2])["x-api-key"] == "secret-key"

    moved = SerperSearch(origin.url + "/moved", api_key_env="TEST_SEARCH_KEY", policy=FAST,
                         transport=transport)
    assert moved(query="q").ok
    assert _lower(origin.requests[-1][2])["x-api-key"] == "secret-key"
    method, path, headers, body = other.requests[-1]
    assert (method, path, json.loads(body)) == ("POST", "/search", {"q": "q", "num": 5})
    assert not set(KEY_HEADERS) & set(_lower(headers))


def test_reader_authorization_does_not_follow_a_redirect(servers, monkeypatch):
    origin, other, _ = servers
    monkeypatch.setenv("TEST_READER_KEY", "reader-secret")
    other.routes["/page"] = send(200, b"page text", "text/plain")
    origin.routes["/https://example.org/a"] = redirect(
        other.url.replace("127.0.0.1", "localhost") + "/page", status=302)
    transport = HttpTransport(AddressPolicy([other.url.replace("127.0.0.1", "localhost")]))
    reader = ReaderService(origin.url, api_key_env="TEST_READER_KEY", policy=FAST,
                           transport=transport)
    result = reader(id="https://example.org/a")
    assert result.ok and result.text.endswith("page text")
    assert _lower(origin.requests[-1][2])["authorization"] == "Bearer reader-secret"
    assert "authorization" not in _lower(other.requests[-1][2])


@pytest.mark.parametrize("target", [
    "http://127.0.0.1:{port}/",  # loopback, but not a configured service
    "http://localhost:{port}/",
    "http://0.0.0.0:{port}/",  # "this host": would reach the canary
    "http://[::ffff:127.0.0.1]:{port}/",  # loopback in IPv6 clothing
    "file:///etc/passwd",
    "ftp://127.0.0.1:{port}/",
])
def test_redirect_to_an_internal_or_odd_target_is_refused(servers, target):
    origin, _, canary = servers
    origin.routes["/page"] = redirect(target.format(port=canary.port), status=302)
    reader = PageReader(origin.url, policy=FAST)
    result = reader(id="doc")
    assert not result.ok and result.error_kind == BLOCKED_URL
    assert canary.requests == []  # nothing was sent there
    assert reader.metrics.snapshot() == {"open/calls": 1, "open/error/blocked_url": 1}


def test_names_are_checked_after_resolution(servers, monkeypatch):
    # A DNS stub for *.test names: the policy must judge the addresses, not the name.
    origin, _, canary = servers
    real = socket.getaddrinfo
    answers = {"internal.test": ["127.0.0.1"], "mixed.test": ["93.184.216.34", "10.1.2.3"]}

    def stub(host, port, *args, **kwargs):
        if host in answers:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port)) for ip in answers[host]]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", stub)
    origin.routes["/page"] = redirect(f"http://internal.test:{canary.port}/", status=302)
    result = PageReader(origin.url, policy=FAST)(id="doc")
    assert result.error_kind == BLOCKED_URL
    assert result.text == "Error: open failed: internal.test resolves to 127.0.0.1, not a public address"
    with pytest.raises(BlockedUrl, match="mixed.test resolves to 10.1.2.3"):
        AddressPolicy().check("http://mixed.test/", deadline=float("inf"))
    assert canary.requests == []


@pytest.mark.parametrize("url", [
    "http://10.0.0.1/", "http://172.16.5.4/", "http://192.168.1.1/", "http://169.254.169.254/",
    "http://100.64.0.1/", "http://224.0.0.1/", "http://255.255.255.255/", "http://0.0.0.0/",
    "http://[::1]/", "http://[fe80::1]/", "http://[fc00::1]/", "http://[ff02::1]/",
    "http://[::ffff:10.0.0.1]/", "http://localhost/", "http://app.localhost/",
    "gopher://example.org/", "javascript:alert(1)", "data:text/plain,x", "http:///nohost",
    "http://example.org:99999/",
])
def test_policy_refuses_non_public_addresses_and_other_schemes(url):
    with pytest.raises(BlockedUrl):
        AddressPolicy().check(url, deadline=float("inf"))


def test_policy_allows_public_literals_and_configured_services():
    target = AddressPolicy().check("https://93.184.216.34/a b?q=1", deadline=float("inf"))
    assert target.addresses == ("93.184.216.34",) and target.path == "/a%20b?q=1"
    policy = AddressPolicy(["http://127.0.0.1:8000/search"])
    assert policy.check("http://127.0.0.1:8000/page", float("inf")).trusted  # same origin
    with pytest.raises(BlockedUrl):
        policy.check("http://127.0.0.1:8001/page", float("inf"))  # another port is not


def test_local_search_ignores_environment_proxies(search_server, monkeypatch):
    with socket.socket() as s:  # a proxy nobody runs
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, dead)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    box = worker_toolbox(search_server.url, policy=FAST)
    assert box.call("search", {"query": "Bob Tanaka born", "num": 1}).text.startswith(
        '1. Bob Tanaka (id: "doc-bob")')
    assert box.call("open", {"id": "doc-lyon"}).ok
    local_name = worker_toolbox(search_server.url.replace("127.0.0.1", "localhost"), policy=FAST)
    assert local_name.call("open", {"id": "doc-lyon"}).ok


def test_remote_services_go_through_the_environment_proxy(monkeypatch):
    # The 4B config's endpoint, used as given (before: ".../search/search"), through a proxy.
    with FaultServer({"http://google.serper.dev/search": send(200, HITS),
                      "google.serper.dev:443": send(403, b"", "text/plain")}) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url.replace("http://", "http://user:pw@"))
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        monkeypatch.setenv("SERPER_API_KEY", "k")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        plain = SerperSearch("http://google.serper.dev/search", policy=FAST)(query="q")
        assert plain.ok
        method, path, headers, _ = proxy.requests[0]
        assert (method, path) == ("POST", "http://google.serper.dev/search")
        headers = _lower(headers)
        assert headers["host"] == "google.serper.dev" and headers["x-api-key"] == "k"
        assert headers["proxy-authorization"] == "Basic dXNlcjpwdw=="  # user:pw

        tls = SerperSearch("https://google.serper.dev/search", policy=FAST)(query="q")
        assert tls.error_kind == CONNECTION_ERROR and "proxy refused the tunnel" in tls.text
        assert proxy.requests[1][:2] == ("CONNECT", "google.serper.dev:443")
        assert "x-api-key" not in _lower(proxy.requests[1][2])  # the key only inside TLS


@pytest.mark.parametrize("cls, given, endpoint", [
    (SerperSearch, "https://google.serper.dev/search", "https://google.serper.dev/search"),
    (SerperSearch, "http://127.0.0.1:8000", "http://127.0.0.1:8000/search"),
    (SerperSearch, "http://127.0.0.1:8000/", "http://127.0.0.1:8000/search"),
    (SerperSearch, "http://127.0.0.1:8000/v2/search", "http://127.0.0.1:8000/v2/search"),
    (RetrievalSearch, "http://127.0.0.1:8000/retrieve", "http://127.0.0.1:8000/retrieve"),
    (RetrievalSearch, "http://127.0.0.1:8000", "http://127.0.0.1:8000/retrieve"),
    (PageReader, "http://127.0.0.1:9000/page", "http://127.0.0.1:9000/page"),
    (PageReader, "http://127.0.0.1:9000", "http://127.0.0.1:9000/page"),
])
def test_urls_are_endpoints_and_bare_origins_get_the_standard_path(cls, given, endpoint):
    assert cls(given).url == endpoint
