"""Shared fixtures: a real local search server, and a tiny model that replays scripted dialogues.

Fitting the model and compiling the slot loop are the expensive parts, so both are session-wide:
every test uses the same slots / max_context / max_new_tokens unless it tests a limit of those.
"""
from __future__ import annotations

import dataclasses
import json
import socket

import jax
import numpy as np
import pytest

from matpo_jax.agents import tools
from matpo_jax.agents.rollout import RolloutConfig, run_rollouts
from matpo_jax.agents.search_server import SearchServer

from scripted_agents import (CORPUS, PlannerScript, SingleScript, WorkerScript, scripted_policy)

REPORT_MAX_CHARS = 200

ADA = PlannerScript(
    question="Where was Ada Lovelace born?",
    workers=(WorkerScript(
        subtask="Find where Ada Lovelace was born.",
        calls=(("search", {"query": "Ada Lovelace born"}), ("open", {"id": "d1"})),
        answer="Ada Lovelace was born in London.",
        summary="<think>d1 says it.</think>Ada Lovelace was born in London. Source: d1."),),
    answer="\\boxed{London}")

PAIR = PlannerScript(  # two subagent calls in one turn
    question="Where were Alan Turing and Grace Hopper born?",
    workers=(
        WorkerScript(subtask="Find where Alan Turing was born.",
                     calls=(("search", {"query": "Alan Turing born"}),),
                     answer="Maida Vale.",
                     summary="Alan Turing was born in Maida Vale. Source: d2."),
        WorkerScript(subtask="Find where Grace Hopper was born.",
                     calls=(("search", {"query": "Grace Hopper born"}),),
                     answer="New York.", summary="Grace Hopper was born in New York. Source: d3."),
    ),
    answer="\\boxed{Maida Vale and New York}",
    parallel=True)

MALFORMED = PlannerScript(  # first turn: a subagent call with a wrong argument name
    question="What was Grace Hopper?",
    workers=(WorkerScript(subtask="Find what Grace Hopper was.",
                          calls=(("open", {"id": "d3"}),),
                          answer="A naval officer.",
                          summary="Grace Hopper was a naval officer. Source: d3."),),
    answer="\\boxed{a naval officer}",
    malformed_first='<tool_call>\n{"name": "subagent", "arguments": {"task": "Grace Hopper"}}\n'
                    '</tool_call>')

TURING = SingleScript(
    question="Where was Alan Turing born?",
    calls=(("search", {"query": "Alan Turing born"}), ("open", {"id": "d2"})),
    answer="\\boxed{Maida Vale}")

# The settings every test shares (one compilation of the slot loop).
BASE = RolloutConfig(mode="matpo", group_size=1, slots=3, max_context=1024, max_new_tokens=48,
                     max_worker_calls_per_turn=2, report_max_chars=REPORT_MAX_CHARS,
                     temperature=0.0, max_turns_planner=4, max_turns_worker=4)


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
        cfg = dataclasses.replace(BASE, **overrides)
        return run_rollouts(policy.state, policy.graphdef, policy.chat, toolbox, questions, cfg,
                            jax.random.key(0))

    return run


def assert_masks_and_logprobs(policy, rollouts):
    """Trainable tokens are exactly the sampled ones, and their log-probs are the model's."""
    teacher = policy.teacher_logprobs([r.tokens for r in rollouts], BASE.max_context)
    for rollout, row in zip(rollouts, teacher):
        assert len(rollout.tokens) == len(rollout.trainable) == len(rollout.logprobs)
        trainable = np.array(rollout.trainable)
        logprobs = np.array(rollout.logprobs)
        assert np.all(logprobs[~trainable] == 0.0)
        sampled = [t for t, m in zip(rollout.tokens, rollout.trainable) if m]
        assert policy.chat.decode(sampled) == "".join(rollout.assistant_texts)
        positions = np.flatnonzero(trainable)
        assert positions.min() > 0  # every sampled token follows a prompt
        np.testing.assert_allclose(logprobs[positions], row[positions - 1], atol=2e-3)
