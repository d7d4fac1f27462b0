"""Scripted rollout scenarios shared by the rollout tests (a module of its own: test files must not
import `conftest`, whose name other test folders share)."""
from __future__ import annotations

import numpy as np

from matpo_jax.config import RolloutSection

from scripted_agents import PlannerScript, SingleScript, WorkerScript

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
BASE = RolloutSection(mode="matpo", group_size=1, decode_slots=3, max_context=1024,
                      max_new_tokens_per_turn=64, max_worker_calls_per_turn=2,
                      report_max_chars=REPORT_MAX_CHARS, temperature=0.0, max_turns_planner=4,
                      max_turns_worker=4)


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
