"""Oracle demonstrations become trainer sequences whose trainable tokens are exactly the policy's."""
from __future__ import annotations

import numpy as np
import pytest

from matpo_jax.agents.trajectory import ROLE_IDS, PLANNER, WORKER
from matpo_jax.data.oracle import LocalCorpusTools, Oracle
from matpo_jax.data.synthetic_world import build_world
from matpo_jax.data.sft_data import demonstration_sequences, demonstrations
from matpo_jax.chat import ChatFormat
from matpo_jax.chat.tokenizer_training import IM_END, train_tokenizer
from fixtures.losses import default_loss


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
    from matpo_jax.chat import extract_boxed

    chat, demos = setup
    seqs = demonstration_sequences(chat, demos, max_len=100_000)
    conversations = [c for d in demos for c in [d, *d.workers]]
    for seq, conv in zip(seqs, conversations):
        assert seq.copy_mask.shape == seq.trainable.shape
        assert seq.trainable[seq.copy_mask].all()
        if conv.role != PLANNER:
            continue
        # the planner's final turn: its boxed answer repeats a worker report, so it is marked
        answer = extract_boxed(conv.messages[-1]["content"]).strip()
        ends = np.flatnonzero(~seq.trainable[:-1] & seq.trainable[1:]) + 1
        last = np.arange(len(seq)) >= ends[-1]
        assert answer in chat.decode(seq.tokens[last & seq.copy_mask])


def test_several_modes_take_turns_over_the_questions():
    world = build_world(seed=3, num_entities=60, num_questions=80, max_hops=2)
    tools = LocalCorpusTools(world.documents)
    oracle = Oracle(tools.search, tools.open)
    questions = world.questions["train"][:6]
    demos = demonstrations(oracle, questions, ("matpo", "single"), solved_only=False)
    assert [d.role for d in demos] == ["planner", "single"] * 3
    assert [len(d.workers) > 0 for d in demos] == [True, False] * 3
    assert demonstrations(oracle, questions[:2], "single", solved_only=False)[0].role == "single"


def test_context_lm_adds_weighted_loss_on_context_after_the_system_prompt(setup):
    from matpo_jax.trainer.loss import LossConfig
    from matpo_jax.trainer.packing import layout_bins
    from matpo_jax.data.sft_data import add_context_lm

    chat, demos = setup
    seqs = demonstration_sequences(chat, demos, max_len=100_000)[:2]
    bins = [[0], [1]]
    row_len = max(len(s) for s in seqs)
    plain = layout_bins(seqs, bins, 2, row_len, row_len, default_loss())
    mixed = layout_bins(seqs, bins, 2, row_len, row_len, default_loss())
    add_context_lm(mixed, seqs, bins, 0.25)
    for row, seq in enumerate(seqs):
        n = len(seq)
        context = ~seq.trainable
        context[:seq.context_start] = False
        assert seq.context_start > 0 and context.any()
        added = (mixed.loss_mask[row, :n] > 0) & (plain.loss_mask[row, :n] == 0)
        np.testing.assert_array_equal(added, context)  # exactly the context after the system turn
        unit = plain.loss_weights[row, :n][seq.trainable].max()
        np.testing.assert_allclose(mixed.loss_weights[row, :n][context], 0.25 * unit)
        keep = plain.loss_mask[row, :n] > 0  # trainable tokens keep mask and weight
        np.testing.assert_array_equal(mixed.loss_weights[row, :n][keep],
                                      plain.loss_weights[row, :n][keep])
    add_context_lm(plain, seqs, bins, 0.0)  # off: nothing changes
    assert plain.loss_mask.sum() < mixed.loss_mask.sum()


def test_thin_workers_keeps_every_planner_and_the_asked_share_of_workers(setup):
    chat, demos = setup
    from matpo_jax.data.sft_data import thin_workers
    many = demos * 40  # enough workers for the share to be measured
    seqs = demonstration_sequences(chat, many, max_len=100_000)
    is_worker = [s.role_id == ROLE_IDS[WORKER] for s in seqs]
    assert thin_workers(seqs, 1.0, np.random.default_rng(0)) == seqs
    kept = thin_workers(seqs, 0.25, np.random.default_rng(0))
    assert [s for s in kept if s.role_id != ROLE_IDS[WORKER]] == [
        s for s, w in zip(seqs, is_worker) if not w]
    share = sum(s.role_id == ROLE_IDS[WORKER] for s in kept) / sum(is_worker)
    assert 0.18 < share < 0.32
    # Seeded: the same draw twice, another seed another draw.
    assert thin_workers(seqs, 0.25, np.random.default_rng(0)) == kept
    assert thin_workers(seqs, 0.25, np.random.default_rng(1)) != kept
    assert not any(s.role_id == ROLE_IDS[WORKER] for s in thin_workers(seqs, 0.0,
                                                                       np.random.default_rng(0)))
