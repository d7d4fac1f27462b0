"""Shared fixtures: a real local search server, and a tiny model that replays scripted dialogues.

Fitting the model and compiling the slot loop are the expensive parts, so both are session-wide:
every test uses the same slots / max_context / max_new_tokens unless it tests a limit of those.
"""
from __future__ import annotations

import dataclasses
import json
import socket

import jax
import pytest

from matpo_jax import tools
from matpo_jax.agents.rollout import EngineOptions, run_rollouts
from matpo_jax.tools.search_server import SearchServer

from rollout_scenarios import ADA, BASE, MALFORMED, PAIR, REPORT_MAX_CHARS, TURING
from scripted_agents import CORPUS, scripted_policy


@pytest.fixture(scope="session")
def search_server(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps(doc) + "\n" for doc in CORPUS))
    with SearchServer(path) as server:
        yield server


@pytest.fixture(scope="session")
def toolbox(search_server):
    return tools.worker_toolbox(search_server.url)


@pytest.fixture(scope="session")
def dead_toolbox():
    """Clients pointed at a port nobody listens on, with no retries: every call fails fast."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    policy = tools.HttpPolicy(max_retries=0, connect_timeout_s=1.0, deadline_s=5.0)
    return tools.worker_toolbox(f"http://127.0.0.1:{port}", policy=policy)


@pytest.fixture(scope="session")
def policy(toolbox):
    def run_tool(name, arguments):
        result = toolbox.call(name, arguments)
        assert result.ok, result.text
        return result.text

    fitted = scripted_policy([ADA, PAIR, MALFORMED], [TURING], run_tool, REPORT_MAX_CHARS)
    assert fitted.margin >= 1.0, f"the scripted fit did not converge: margin {fitted.margin}"
    return fitted


@pytest.fixture(scope="session")
def rollout(policy, toolbox):
    """rollout(questions, toolbox=..., **config overrides) -> RolloutBatch."""

    def run(questions, toolbox=toolbox, **overrides):
        engine_only = {f.name for f in dataclasses.fields(EngineOptions)}
        options = EngineOptions(**{k: v for k, v in overrides.items() if k in engine_only})
        cfg = dataclasses.replace(BASE, **{k: v for k, v in overrides.items()
                                           if k not in engine_only})
        return run_rollouts(policy.state, policy.graphdef, policy.chat, toolbox, questions, cfg,
                            jax.random.key(0), options)

    return run
