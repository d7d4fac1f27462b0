"""Oracle demonstrations become trainer sequences whose trainable tokens are exactly the policy's."""
from __future__ import annotations

import numpy as np
import pytest

from matpo_jax.agents.trajectory import ROLE_IDS, PLANNER, WORKER
from matpo_jax.data.oracle import LocalCorpusTools, Oracle
from matpo_jax.data.synthetic_world import build_world
from matpo_jax.sft_data import demonstration_sequences, demonstrations
from matpo_jax.tokenizer import ChatFormat
from matpo_jax.tokenizer_training import IM_END, train_tokenizer


@pytest.fixture(scope="module")
def setup():
    world = build_world(seed=3, num_entities=60, num_questions=80, max_hops=2)
    tools = LocalCorpusTools(world.documents)
    oracle = Oracle(tools.search, tools.open)
    questions = world.questions["train"][:6]
    demos = demonstrations(oracle, questions, "matpo")
    texts = [d.contents for d in world.documents]
    texts += [m["content"] for d in demos for c in [d, *d.workers] for m in c.messages]
    chat = ChatFormat(train_tokenizer(texts, 600))
    return chat, demos


def test_trainable_tokens_are_exactly_the_assistant_turns(setup):
    chat, demos = setup
    seqs = demonstration_sequences(chat, demos, max_len=100_000)
    conversations = [c for d in demos for c in [d, *d.workers]]
    assert len(seqs) == len(conversations) > len(demos)
    for seq, conv in zip(seqs, conversations):
        trained = chat.decode(seq.tokens[seq.trainable])
        expected = "".join(m["content"] + IM_END for m in conv.messages if m["role"] == "assistant")
        assert trained == expected
        assert seq.role_id == ROLE_IDS[conv.role]
        assert not seq.old_logprobs.any()


def test_workers_belong_to_their_planner_and_long_groups_are_dropped_whole(setup):
    chat, demos = setup
    seqs = demonstration_sequences(chat, demos, max_len=100_000)
    planners = [s for s in seqs if s.role_id == ROLE_IDS[PLANNER]]
    for planner in planners:
        workers = [s for s in seqs if s.group_id == planner.rollout_id and s is not planner]
        assert workers and all(w.role_id == ROLE_IDS[WORKER] for w in workers)
    # A budget that fits every planner but not the longest worker drops that worker's whole group.
    longest_worker = max(len(s) for s in seqs if s.role_id == ROLE_IDS[WORKER])
    kept = demonstration_sequences(chat, demos, max_len=longest_worker - 1)
    assert len(kept) < len(seqs)
    kept_groups = {s.group_id for s in kept}
    for group in kept_groups:
        assert sum(s.group_id == group for s in kept) == sum(s.group_id == group for s in seqs)
    assert all(len(s) <= longest_worker - 1 for s in kept)
    assert np.all([s.trainable.any() for s in kept])


def test_copy_mask_covers_the_copied_answer_and_only_trainable_tokens(setup):
    from matpo_jax.tokenizer import extract_final_answer

    chat, demos = setup
    seqs = demonstration_sequences(chat, demos, max_len=100_000)
    conversations = [c for d in demos for c in [d, *d.workers]]
    for seq, conv in zip(seqs, conversations):
        assert seq.copy_mask.shape == seq.trainable.shape
        assert seq.trainable[seq.copy_mask].all()
        if conv.role != PLANNER:
            continue
        # the planner's final turn: its boxed answer repeats a worker report, so it is marked
        answer = extract_final_answer(conv.messages[-1]["content"]).strip()
        ends = np.flatnonzero(~seq.trainable[:-1] & seq.trainable[1:]) + 1
        last = np.arange(len(seq)) >= ends[-1]
        assert answer in chat.decode(seq.tokens[last & seq.copy_mask])
