"""Shared fixtures for the RL tests: a tiny Qwen3, meshes, and synthetic MATPO rollouts."""
from __future__ import annotations

import numpy as np
import pytest

from matpo_jax.agents.trajectory import PLANNER, WORKER, Rollout, ToolCallRecord

VOCAB = 128


def tiny_model_config():
    from matpo_jax.model import Qwen3Config

    return Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8)


@pytest.fixture(scope="session")
def tiny_model():
    from flax import nnx

    from matpo_jax.model import Qwen3ForCausalLM

    return Qwen3ForCausalLM(tiny_model_config(), rngs=nnx.Rngs(0))


def make_rollout(rollout_id, role, query_index, sample_index, parent_id, pieces, rng,
                 texts=(), calls=()):
    """A rollout from (length, trainable) pieces; sampled pieces get random log-probs."""
    r = Rollout(rollout_id=rollout_id, role=role, query_index=query_index,
                sample_index=sample_index, parent_id=parent_id,
                assistant_texts=list(texts), tool_calls=list(calls))
    for length, trainable in pieces:
        ids = rng.integers(1, VOCAB, length)
        logprobs = -rng.uniform(0.1, 4.0, length) if trainable else None
        r.append(ids, trainable=trainable, logprobs=logprobs)
    return r


def make_matpo_batch(seed=0, queries=2, group=3, max_workers=2, scale=1):
    """Planner rollouts (G per query) with 0..max_workers workers each, with boxed answers,
    a mix of valid/invalid tool calls, and token lengths around 10-30 x scale."""
    rng = np.random.default_rng(seed)
    rollouts, golds, next_id = [], [f"answer {q}" for q in range(queries)], 0
    for q in range(queries):
        for g in range(group):
            planner_id = next_id
            next_id += 1
            correct = rng.random() < 0.5
            text = f"so \\boxed{{{golds[q] if correct else 'wrong'}}}"
            n_workers = int(rng.integers(0, max_workers + 1))
            calls = [ToolCallRecord(turn=k, name="subagent", arguments={"subtask": "x"},
                                    valid=bool(rng.random() < 0.8)) for k in range(n_workers)]
            planner = make_rollout(
                planner_id, PLANNER, q, g, None,
                [(int(rng.integers(4, 8)) * scale, False), (int(rng.integers(3, 8)) * scale, True),
                 (int(rng.integers(2, 6)) * scale, False), (int(rng.integers(3, 8)) * scale, True)],
                rng, texts=["thinking", text], calls=calls)
            rollouts.append(planner)
            for k in range(n_workers):
                worker = make_rollout(
                    next_id, WORKER, q, g, planner_id,
                    [(int(rng.integers(3, 7)) * scale, False),
                     (int(rng.integers(2, 9)) * scale, True),
                     (int(rng.integers(1, 4)) * scale, False),
                     (int(rng.integers(2, 6)) * scale, True)],
                    rng, texts=["\\boxed{worker answer must be ignored}"],
                    calls=[ToolCallRecord(turn=0, name="search", arguments={"query": "q"},
                                          valid=bool(rng.random() < 0.7))])
                planner.child_ids.append(next_id)
                next_id += 1
                rollouts.append(worker)
    return rollouts, golds


@pytest.fixture(scope="session")
def rollout_batch():
    """Factory: make_matpo_batch(seed, queries, group, max_workers, scale)."""
    return make_matpo_batch


@pytest.fixture(scope="session")
def rollout_factory():
    """Factory: make_rollout(rollout_id, role, query_index, sample_index, parent_id, pieces,
    rng)."""
    return make_rollout
