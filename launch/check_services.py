"""Checks that the services a config needs answer, before any training starts (run.sh runs it on
every worker, with the env file's secrets in the environment).

    python launch/check_services.py --config=configs/qwen3_4b_musique.py [--config.a.b=v ...]

Each service gets one real request through the client training uses: a web search (Serper or
retrieval protocol) when the search backend is remote, a page read when a page reader is
configured (any HTTP answer counts: the probe page may be unknown to it), one grading by the LLM
judge when rewards come from it. API keys the remote services need must be set. A service that
cannot be reached yet (just started) is retried until --wait_s. One line per service; exit 1
when any failed.

Config fields read (`checks_from_config`): tools.search_backend, tools.search_url,
tools.page_url, tools.api_key_env, tools.timeout_s, reward.method, reward.judge_url,
reward.judge_model, reward.judge_api_key_env.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import os
import socket
import sys
import time
from typing import Callable
from urllib.parse import urlsplit

# Transport failures worth waiting out (a service still starting); anything else is final.
_RETRYABLE = ("connection_error", "timeout", "server_error")
PROBE_QUERY = "matpo health check"
PROBE_PAGE = "https://example.com/"


@dataclasses.dataclass(frozen=True)
class Probe:
    """Outcome of one request: ok, or why not and whether waiting could help."""

    ok: bool
    detail: str
    retryable: bool = False
    kind: str | None = None  # the client's error kind (tools.clients), when it failed


@dataclasses.dataclass(frozen=True)
class Check:
    service: str  # "search", "page reader", "judge"
    url: str
    probe: Callable[[], Probe]


def is_loopback(url: str) -> bool:
    """A service on this host (127.0.0.1, ::1, localhost): it needs no API key."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def tool_probe(client, **arguments) -> Callable[[], Probe]:
    """A probe that calls a tools.clients client once (the clients never raise)."""

    def probe() -> Probe:
        result = client(**arguments)
        if result.ok:
            return Probe(True, f"answered {len(result.text)} chars")
        return Probe(False, f"{result.error_kind}: {result.text}",
                     retryable=result.error_kind in _RETRYABLE, kind=result.error_kind)
    return probe


def page_probe(reader) -> Callable[[], Probe]:
    """The page reader is up when it answers at all: an unknown page is a 4xx, not an outage."""
    call = tool_probe(reader, id=PROBE_PAGE)

    def probe() -> Probe:
        outcome = call()
        if outcome.kind in ("client_error", "bad_response", "too_large"):
            return Probe(True, f"answered ({outcome.kind} for {PROBE_PAGE})")
        return outcome
    return probe


def judge_probe(judge) -> Callable[[], Probe]:
    from matpo_jax.rl.judge import JudgeError

    def probe() -> Probe:
        try:
            grade = judge.grade("What is 2 + 2?", "4", "4")
        except JudgeError as error:
            # "failed after N attempts": connection errors, 429 and 5xx; the rest is final.
            return Probe(False, str(error), retryable="failed after" in str(error))
        return Probe(True, f"graded a probe answer '{grade}'")
    return probe


def checks_from_config(cfg, environ=os.environ) -> tuple[list[Check], list[str]]:
    """The checks the config needs and the problems found without any request (missing keys or
    URLs). Every config field this script reads is read here."""
    from matpo_jax.rl.judge import JudgeConfig, LLMJudge
    from matpo_jax.tools.clients import HttpPolicy, PageReader, RetrievalSearch, SerperSearch

    tools, reward = cfg.tools, cfg.reward
    timeout = float(tools.timeout_s)
    policy = HttpPolicy(connect_timeout_s=min(5.0, timeout), read_timeout_s=timeout,
                        deadline_s=timeout, max_retries=0)
    checks, problems = [], []
    backend = tools.search_backend
    if backend in ("serper", "retrieval"):
        url = tools.search_url
        if not url:
            problems.append(f"tools.search_url is not set (tools.search_backend={backend})")
        else:
            if backend == "serper":
                client = SerperSearch(url, api_key_env=tools.api_key_env, policy=policy)
                if not is_loopback(url) and not environ.get(tools.api_key_env):
                    problems.append(f"{tools.api_key_env} is not set (tools.api_key_env): put it "
                                    "in the env file")
            else:
                client = RetrievalSearch(url, policy=policy)
            checks.append(Check("search", url, tool_probe(client, query=PROBE_QUERY)))
    if tools.page_url:
        reader = PageReader(tools.page_url, policy=policy)
        checks.append(Check("page reader", tools.page_url, page_probe(reader)))
    if reward.method == "judge":
        url = reward.judge_url
        if not url:
            problems.append("reward.judge_url is not set (reward.method=judge)")
        else:
            if not is_loopback(url) and not environ.get(reward.judge_api_key_env):
                problems.append(f"{reward.judge_api_key_env} is not set "
                                "(reward.judge_api_key_env): put it in the env file")
            judge = LLMJudge(JudgeConfig(base_url=url, model=reward.judge_model,
                                         api_key_env=reward.judge_api_key_env,
                                         timeout_s=timeout, max_retries=0))
            checks.append(Check("judge", url, judge_probe(judge)))
    return checks, problems


def run_checks(checks: list[Check], wait_s: float, poll_s: float = 2.0,
               clock=time.monotonic, sleep=time.sleep) -> list[tuple[Check, Probe]]:
    """Probes every check; retryable failures again every poll_s until wait_s has passed."""
    deadline = clock() + wait_s
    results = []
    for check in checks:
        while True:
            outcome = check.probe()
            if outcome.ok or not outcome.retryable or clock() + poll_s > deadline:
                break
            sleep(poll_s)
        results.append((check, outcome))
    return results


def report(results, problems, host: str | None = None) -> tuple[list[str], bool]:
    """One line per service and per problem, and whether everything is fine."""
    host = host or socket.gethostname()
    lines = [f"{host}: {'ok' if probe.ok else 'FAILED'} {check.service} {check.url}: "
             f"{' '.join(probe.detail.split())[:300]}" for check, probe in results]
    lines += [f"{host}: FAILED {problem}" for problem in problems]
    if not results and not problems:
        lines.append(f"{host}: ok no remote service configured (local search is started by "
                     "the training process)")
    healthy = not problems and all(probe.ok for _, probe in results)
    return lines, healthy


def main(argv=None) -> int:
    from absl import flags

    from matpo_jax import config as config_lib

    flag_values = flags.FlagValues()
    argv = list(sys.argv if argv is None else argv)
    config, _ = config_lib.define_flags(flag_values=flag_values)
    wait = flags.DEFINE_float("wait_s", 120.0, "How long to wait for a service that is not up "
                              "yet.", flag_values=flag_values)
    try:
        config_lib.parse_flags(argv, flag_values)
        cfg = config_lib.config_from_flags(config, check_files=False)
    except config_lib.ConfigError as error:
        print(f"FATAL config error: {error}", file=sys.stderr)
        return 2
    checks, problems = checks_from_config(cfg)
    lines, healthy = report(run_checks(checks, wait.value), problems)
    print("\n".join(lines), flush=True)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
