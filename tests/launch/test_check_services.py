"""launch/check_services.py against real local services: the search server (Serper protocol and
page reads) and a scripted OpenAI-compatible judge; a service that is down fails the check."""
import importlib.util
import os
import socket
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JUDGE_REPLY = {"choices": [{"message": {"content": "A"}}]}


@pytest.fixture(scope="module")
def check_services():
    spec = importlib.util.spec_from_file_location("check_services", ROOT / "launch" /
                                                  "check_services.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.fixture
def closed_url():
    """A local URL nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def config(search_url, page_url, judge_url, backend="serper", method="judge"):
    tools = types.SimpleNamespace(search_backend=backend, search_url=search_url,
                                  page_url=page_url, api_key_env="SERPER_API_KEY", timeout_s=5.0)
    reward = types.SimpleNamespace(method=method, judge_url=judge_url, judge_model="grader",
                                   judge_api_key_env="OPENAI_API_KEY")
    return types.SimpleNamespace(tools=tools, reward=reward)


def test_every_configured_service_answers(check_services, search_server, scripted_server,
                                          respond, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "judge-key")
    judge = scripted_server(respond(200, JUDGE_REPLY))
    checks, problems = check_services.checks_from_config(
        config(search_server.url, search_server.url, judge.url + "/v1"))
    lines, healthy = check_services.report(check_services.run_checks(checks, wait_s=0), problems,
                                           host="w0")
    assert healthy and problems == []
    prefixes = [f"w0: ok search {search_server.url}: answered",
                f"w0: ok page reader {search_server.url}: answered",
                f"w0: ok judge {judge.url}/v1: graded a probe answer 'A'"]
    assert len(lines) == 3 and all(map(str.startswith, lines, prefixes)), lines
    assert "client_error for https://example.com/" in lines[1]  # the probe page is unknown: up
    (_, path, headers, _), = judge.requests
    assert path == "/v1/chat/completions" and headers["Authorization"] == "Bearer judge-key"


def test_a_service_that_is_down_fails_the_check(check_services, search_server, closed_url):
    checks, problems = check_services.checks_from_config(
        config(search_server.url, closed_url, None, method="exact"))
    results = check_services.run_checks(checks, wait_s=0)
    lines, healthy = check_services.report(results, problems, host="w3")
    assert not healthy
    assert lines[0].startswith(f"w3: ok search {search_server.url}")
    assert lines[1].startswith(f"w3: FAILED page reader {closed_url}: connection_error")


def test_missing_keys_and_urls_are_named(check_services):
    remote = config("https://search.example.com", None, None)
    _, problems = check_services.checks_from_config(remote, environ={})
    assert problems == [
        "SERPER_API_KEY is not set (tools.api_key_env): put it in the env file",
        "reward.judge_url is not set (reward.method=judge)"]
    _, problems = check_services.checks_from_config(
        config("https://search.example.com", None, "https://judge.example.com/v1"),
        environ={"SERPER_API_KEY": "x"})
    assert problems == ["OPENAI_API_KEY is not set (reward.judge_api_key_env): put it in the "
                        "env file"]
    # Services on this host need no key.
    _, problems = check_services.checks_from_config(
        config("http://127.0.0.1:1", None, "http://localhost:2/v1"), environ={})
    assert problems == []


def test_a_service_still_starting_is_waited_for(check_services):
    outcomes = [check_services.Probe(False, "connection_error: refused", retryable=True)] * 2
    outcomes.append(check_services.Probe(True, "answered"))
    now, slept = [0.0], []

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    check = check_services.Check("page reader", "http://x", lambda: outcomes.pop(0))
    (_, probe), = check_services.run_checks([check], wait_s=10, poll_s=2, clock=lambda: now[0],
                                            sleep=sleep)
    assert probe.ok and slept == [2, 2]


def test_command_line_exits_1_naming_the_failed_service(search_server, scripted_server, respond,
                                                        closed_url, tmp_path):
    judge = scripted_server(respond(200, JUDGE_REPLY))
    config_file = tmp_path / "pod.py"
    config_file.write_text(
        "from matpo_jax.config import base_config\n\n\n"
        "def get_config():\n"
        "    c = base_config()\n"
        "    c.tools.search_backend = 'serper'\n"
        "    c.reward.method = 'judge'\n"
        "    return c\n")
    result = subprocess.run(
        [sys.executable, str(ROOT / "launch" / "check_services.py"), f"--config={config_file}",
         f"--config.tools.search_url={search_server.url}", f"--config.tools.page_url={closed_url}",
         f"--config.reward.judge_url={judge.url}/v1", "--wait_s=0"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"})
    assert result.returncode == 1, result.stderr
    statuses = [line.split(" ")[1:3] for line in result.stdout.strip().splitlines()]
    assert statuses == [["ok", "search"], ["FAILED", "page"], ["ok", "judge"]]
