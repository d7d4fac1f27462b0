"""Shared prompts in packed rows: samples that start with one prompt hold it once per row, each
continuing it in a segment of its own. The loss, its gradient, every metric and the log-probs
of every scored token are those of the unshared layout up to float rounding, in fewer rows;
prompts that differ, are too short, or belong to another role are not shared."""
import jax
import numpy as np
import optax
import pytest

from matpo_jax import parallel
from matpo_jax.model.packed_attention import key_block_starts
from matpo_jax.agents.trajectory import PLANNER, Rollout
from matpo_jax.rl import rewards
from matpo_jax.rl.batch import matpo_batch
from matpo_jax.trainer import packing
from matpo_jax.trainer import step as ts
from fixtures.losses import default_loss
from fixtures.rl_batches import VOCAB

ROW_LEN = 96


def sequence(rng, prompt, sampled, rollout_id, role_id=0, group_id=None, advantage=None):
    """prompt tokens, then `sampled` trainable tokens with sampler log-probs."""
    tokens = np.concatenate([prompt, rng.integers(1, VOCAB, sampled)]).astype(np.int32)
    trainable = np.arange(len(tokens)) >= len(prompt)
    return packing.TrainSequence(
        tokens=tokens, trainable=trainable,
        old_logprobs=np.where(trainable, -rng.uniform(0.1, 3.0, len(tokens)), 0.0).astype(
            np.float32),
        advantage=float(rng.normal()) if advantage is None else advantage, role_id=role_id,
        rollout_id=rollout_id, group_id=rollout_id if group_id is None else group_id,
        ref_logprobs=-rng.uniform(0.1, 3.0, len(tokens)).astype(np.float32))


def prompt_groups(seed=0):
    """Two questions x 4 samples (planners, prompts of 24 and 30 tokens), 3 workers with one
    sub-task prompt, a worker with its own, and a planner whose prompt is too short to share."""
    rng = np.random.default_rng(seed)
    seqs, rid = [], 0
    for prompt_len in (24, 30):
        prompt = rng.integers(1, VOCAB, prompt_len)
        for _ in range(4):
            seqs.append(sequence(rng, prompt, int(rng.integers(3, 12)), rid))
            rid += 1
    task = rng.integers(1, VOCAB, 20)
    for parent in (0, 1, 2):
        seqs.append(sequence(rng, task, int(rng.integers(4, 10)), rid, role_id=1,
                             group_id=parent))
        rid += 1
    seqs.append(sequence(rng, rng.integers(1, VOCAB, 22), 6, rid, role_id=1, group_id=3))
    short = rng.integers(1, VOCAB, 5)  # a shared prompt under MIN_SHARED_PROMPT stays unshared
    for _ in range(2):
        rid += 1
        seqs.append(sequence(rng, short, 7, rid))
    return seqs


def per_rollout(batch, values):
    """{rollout id: the values at its loss positions, in order}."""
    values, ids, mask = np.asarray(values), np.asarray(batch.rollout_ids), batch.loss_mask != 0
    return {int(r): values[(ids == r) & mask] for r in np.unique(ids[ids >= 0])}


@pytest.fixture(scope="module")
def train_fns(tiny_model):
    loss = default_loss(kl_coef=0.1, entropy_coef=0.01)
    config = ts.TrainStepConfig(loss=loss, micro_batches=2)
    mesh = parallel.make_mesh(devices=jax.devices()[:1])
    graphdef, state, shardings = ts.init_train_state(tiny_model, optax.sgd(0.1), mesh)
    return dict(loss=loss, state=state, grads=ts.make_gradient_fn(graphdef, config, mesh, shardings),
                logprobs=ts.make_logprob_fn(graphdef, config, mesh, shardings))


def test_units_share_identical_prompts_of_one_role_only():
    seqs = prompt_groups()
    units = packing.shared_prompt_units(seqs, range(len(seqs)), ROW_LEN)
    shared = [u for u in units if isinstance(u, packing.SharedPrompt)]
    covered = sorted(i for u in shared for i in u.members)
    # Both questions' planners and the three workers of one sub-task; not the lone worker
    # (index 11) or the 5-token prompts (12, 13).
    assert covered == list(range(11))
    assert {u.shared for u in shared} == {23, 29, 19}  # each prompt less its last token
    assert sorted(u for u in units if not isinstance(u, packing.SharedPrompt)) == [11, 12, 13]
    # Continuations that do not fit one row beside the prompt are split, never cut.
    narrow = packing.shared_prompt_units(seqs, range(len(seqs)), 40)
    for u in narrow:
        assert packing.unit_length(u, seqs) <= 40


def test_layout_continues_the_prompt_in_each_segment():
    seqs = prompt_groups()
    loss = default_loss()
    plain = packing.pack_sequences(seqs, ROW_LEN, loss_config=loss)
    shared = packing.pack_sequences(seqs, ROW_LEN, loss_config=loss, share_prompts=True)
    assert plain.prefix_ids is None
    assert shared.shape[0] < plain.shape[0]
    assert (shared.segment_ids > 0).sum() < (plain.segment_ids > 0).sum()
    # Every sequence's tokens are its prompt's shared part (the prefix segment its segment
    # names) followed by its own segment, at positions 0..L-1.
    for row in range(shared.shape[0]):
        seg, pre = shared.segment_ids[row], shared.prefix_ids[row]
        for s_id in np.unique(seg[seg > 0]):
            own = seg == s_id
            prefix = np.unique(pre[own])
            assert len(prefix) == 1
            rebuilt = shared.tokens[row][own]
            positions = shared.positions[row][own]
            if prefix[0]:
                rebuilt = np.concatenate([shared.tokens[row][seg == prefix[0]], rebuilt])
                positions = np.concatenate([shared.positions[row][seg == prefix[0]], positions])
                assert not shared.loss_mask[row][seg == prefix[0]].any()
            ids = np.unique(shared.rollout_ids[row][own])
            if ids[0] < 0:  # a prefix segment itself
                continue
            original = next(s for s in seqs if s.rollout_id == ids[0])
            np.testing.assert_array_equal(rebuilt, original.tokens)
            np.testing.assert_array_equal(positions, np.arange(len(original)))
    # The same loss tokens, weights and advantages per rollout.
    for field in ("loss_weights", "advantages", "old_logprobs", "ref_logprobs"):
        a, b = per_rollout(plain, getattr(plain, field)), per_rollout(shared, getattr(shared, field))
        assert a.keys() == b.keys()
        for r in a:
            np.testing.assert_array_equal(a[r], b[r], err_msg=f"{field} of rollout {r}")


def test_loss_gradient_and_logprobs_equal_the_unshared_layout(train_fns):
    seqs, loss = prompt_groups(seed=1), train_fns["loss"]
    plain = packing.pack_sequences(seqs, ROW_LEN, loss_config=loss, rows=8)
    shared = packing.pack_sequences(seqs, ROW_LEN, loss_config=loss, rows=8, share_prompts=True)
    state = train_fns["state"]
    loss_plain, grads_plain, metrics_plain = train_fns["grads"](state, plain)
    loss_shared, grads_shared, metrics_shared = train_fns["grads"](state, shared)
    np.testing.assert_allclose(float(loss_shared), float(loss_plain), rtol=1e-5, atol=1e-7)
    for a, b in zip(jax.tree.leaves(grads_shared), jax.tree.leaves(grads_plain)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    for key in metrics_plain:
        np.testing.assert_allclose(float(metrics_shared[key]), float(metrics_plain[key]),
                                   rtol=1e-4, atol=1e-6, err_msg=key)
    # The KL reference / rollout-correction pass reads the same log-probs per rollout.
    got = per_rollout(shared, train_fns["logprobs"](state.params, state.frozen, shared))
    want = per_rollout(plain, train_fns["logprobs"](state.params, state.frozen, plain))
    for r in want:
        np.testing.assert_allclose(got[r], want[r], rtol=1e-5, atol=1e-5)


def test_a_segment_does_not_see_its_neighbours_through_the_prefix(train_fns):
    """Changing one continuation's tokens moves no other sequence's log-probs in the row."""
    seqs, loss, state = prompt_groups(seed=2), train_fns["loss"], train_fns["state"]
    before = packing.pack_sequences(seqs, ROW_LEN, loss_config=loss, rows=8, share_prompts=True)
    changed = list(seqs)
    victim = changed[1]
    tokens = victim.tokens.copy()
    tokens[-3:] = (tokens[-3:] % (VOCAB - 1)) + 1
    changed[1] = packing.TrainSequence(**{**victim.__dict__, "tokens": tokens})
    after = packing.pack_sequences(changed, ROW_LEN, loss_config=loss, rows=8, share_prompts=True)
    np.testing.assert_array_equal(before.segment_ids, after.segment_ids)
    lp_before = per_rollout(before, train_fns["logprobs"](state.params, state.frozen, before))
    lp_after = per_rollout(after, train_fns["logprobs"](state.params, state.frozen, after))
    for r in lp_before:
        if r != victim.rollout_id:
            np.testing.assert_array_equal(lp_before[r], lp_after[r])
    assert not np.array_equal(lp_before[victim.rollout_id], lp_after[victim.rollout_id])


def test_key_blocks_start_at_the_shared_prefix():
    seg = np.array([[1, 1, 1, 1, 2, 2, 3, 3]])
    pre = np.array([[0, 0, 0, 0, 1, 1, 1, 1]])
    # Without the prefix, block 3 (segment 3) would start at its own first position.
    np.testing.assert_array_equal(key_block_starts(seg, 2), [0, 0, 2, 3])
    np.testing.assert_array_equal(key_block_starts(seg, 2, pre), [0, 0, 0, 0])


def planner_rollouts(seed=3, queries=2, group=4):
    """Each question's G planner rollouts: one prompt, then their own sampled answers."""
    rng = np.random.default_rng(seed)
    rollouts, golds = [], [f"answer {q}" for q in range(queries)]
    for q in range(queries):
        prompt = rng.integers(1, VOCAB, 24)
        for g in range(group):
            answer = golds[q] if rng.random() < 0.5 else "wrong"
            r = Rollout(rollout_id=len(rollouts), role=PLANNER, query_index=q, sample_index=g,
                        parent_id=None, assistant_texts=[f"so \\boxed{{{answer}}}"])
            r.append(prompt, trainable=False)
            sampled = int(rng.integers(4, 12))
            r.append(rng.integers(1, VOCAB, sampled), trainable=True,
                     logprobs=-rng.uniform(0.1, 3.0, sampled))
            rollouts.append(r)
    return rollouts, golds


def test_matpo_batch_shares_each_questions_prompt():
    """The RL batch: each question's G planners hold their prompt once, the weights and
    advantages per rollout are unchanged; the setwise ratio's packing refuses to share."""
    rollouts, golds = planner_rollouts()
    reward = rewards.rewards_by_id(rewards.rollout_rewards(rollouts, golds))
    loss = default_loss()
    kwargs = dict(loss_config=loss, pack_len=128, row_multiple=2)
    plain = matpo_batch(rollouts, reward, **kwargs).batch
    shared = matpo_batch(rollouts, reward, share_prompts=True, **kwargs).batch
    assert shared.prefix_ids is not None and (shared.prefix_ids > 0).any()
    assert (shared.segment_ids > 0).sum() < (plain.segment_ids > 0).sum()
    for field in ("loss_weights", "advantages"):
        a, b = per_rollout(plain, getattr(plain, field)), per_rollout(shared, getattr(shared, field))
        assert a.keys() == b.keys() and a
        for r in a:
            np.testing.assert_array_equal(a[r], b[r])
    # A process whose rollouts share no prompt still gives its part the same structure.
    lone = matpo_batch(rollouts[:1], {0: reward[0]}, share_prompts=True, **kwargs).batch
    assert lone.prefix_ids is not None and not lone.prefix_ids.any()
    with pytest.raises(packing.PackingError, match="setwise"):
        packing.pack_sequences(prompt_groups(), ROW_LEN, loss_config=loss, share_prompts=True,
                               set_classes=1)
