"""Packing: layout invariants, credit assignment on worker tokens, static row buckets, errors."""
import dataclasses

import numpy as np
import pytest

from matpo_jax.agents.trajectory import PLANNER, WORKER
from matpo_jax.rl import advantages, rewards
from matpo_jax.rl.batch import sequences_from_rollouts
from matpo_jax.trainer import packing
from fixtures.losses import default_loss

LOSS = default_loss()  # the default experiment's loss


def _sequences(rollout_batch, seed=0, **kw):
    rollouts, golds = rollout_batch(seed=seed, **kw)
    reward = rewards.rewards_by_id(rewards.rollout_rewards(rollouts, golds))
    adv = advantages.assign_advantages(rollouts, reward)
    return rollouts, adv, sequences_from_rollouts(rollouts, adv)


def test_packed_layout_reproduces_every_sequence(rollout_batch):
    _, _, seqs = _sequences(rollout_batch, queries=3, group=3, max_workers=3)
    max_len = 64
    batch = packing.pack_sequences(seqs, max_len, row_multiple=4, loss_config=LOSS)
    assert batch.shape[0] % 4 == 0 and batch.shape[1] == max_len
    assert batch.efficiency() > packing.pad_sequences(seqs, max_len, loss_config=LOSS).efficiency()
    seen = set()
    for row in range(batch.shape[0]):
        segs = batch.segment_ids[row]
        present = [s for s in np.unique(segs) if s > 0]
        # 1-based, consecutive, contiguous, and padding only at the end of the row.
        assert present == list(range(1, len(present) + 1))
        used = int((segs > 0).sum())
        assert (segs[used:] == 0).all() and (batch.rollout_ids[row, used:] == -1).all()
        for s in present:
            span = np.flatnonzero(segs == s)
            assert (np.diff(span) == 1).all()
            rid = int(batch.rollout_ids[row, span[0]])
            seq = next(q for q in seqs if q.rollout_id == rid)
            np.testing.assert_array_equal(batch.tokens[row, span], seq.tokens)
            np.testing.assert_array_equal(batch.positions[row, span], np.arange(len(seq)))
            np.testing.assert_array_equal(batch.old_logprobs[row, span], seq.old_logprobs)
            assert (batch.role_ids[row, span] == seq.role_id).all()
            expected_mask = seq.trainable.copy()
            expected_mask[0] = False  # nothing before a segment's first token predicts it
            np.testing.assert_array_equal(batch.loss_mask[row, span], expected_mask)
            seen.add(rid)
    assert seen == {s.rollout_id for s in seqs}
    assert batch.num_loss_tokens() == sum(int(s.trainable[1:].sum()) for s in seqs)


def test_worker_tokens_carry_parent_advantage_where_parent_mask_is_zero(rollout_factory):
    rng = np.random.default_rng(0)
    # Planner: 12 prompt tokens then 6 sampled; worker: 3 prompt tokens then 8 sampled, so the
    # worker trains at positions 3..10 where the planner's own mask is 0.
    planners = [rollout_factory(i, PLANNER, 0, i, None, [(12, False), (6, True)], rng,
                                texts=[f"\\boxed{{{'yes' if i == 0 else 'no'}}}"])
                for i in range(2)]
    workers = [rollout_factory(2 + i, WORKER, 0, i, i, [(3, False), (8, True), (2, False)], rng)
               for i in range(2)]
    rollouts = planners + workers
    reward = rewards.rewards_by_id(rewards.rollout_rewards(rollouts, ["yes"]))
    adv = advantages.assign_advantages(rollouts, reward)
    assert adv[0] > 0 > adv[1]
    planner_mask = np.asarray(planners[0].trainable)
    worker_mask = np.asarray(workers[0].trainable)
    assert (worker_mask[:11] & ~planner_mask[:11]).sum() == 8  # the defect's blind spot
    for layout in (packing.pack_sequences, packing.pad_sequences):
        batch = layout(sequences_from_rollouts(rollouts, adv), 32, loss_config=LOSS)
        for w in workers:
            on_worker = batch.rollout_ids == w.rollout_id
            trained = on_worker & (batch.loss_mask > 0)
            assert trained.sum() == 8
            np.testing.assert_array_equal(batch.advantages[trained], np.float32(adv[w.parent_id]))
            assert (batch.advantages[on_worker & (batch.loss_mask == 0)] == 0).all()


def test_rows_are_static_per_bucket_and_errors_are_clear(rollout_batch):
    _, _, seqs = _sequences(rollout_batch, queries=2, group=2)
    batch = packing.pack_sequences(seqs, 64, rows=16, loss_config=LOSS)
    assert batch.shape == (16, 64)
    with pytest.raises(packing.PackingError, match="multiple"):
        packing.pack_sequences(seqs, 64, rows=10, row_multiple=4, loss_config=LOSS)
    with pytest.raises(packing.PackingError, match="need"):
        packing.pad_sequences(seqs, 64, rows=1, loss_config=LOSS)
    longest = max(seqs, key=len)
    with pytest.raises(packing.PackingError, match=f"rollout {longest.rollout_id}.*max_len"):
        packing.pack_sequences(seqs, len(longest) - 1, loss_config=LOSS)


def test_first_fit_decreasing_respects_capacity():
    rng = np.random.default_rng(0)
    lengths = list(rng.integers(1, 100, 200))
    bins = packing.first_fit_decreasing(lengths, 128)
    assert sorted(i for b in bins for i in b) == list(range(200))
    assert all(sum(lengths[i] for i in b) <= 128 for b in bins)
    assert len(bins) <= int(np.ceil(sum(lengths) / 128 * 11 / 9)) + 1  # FFD's 11/9 OPT bound


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                  "seq-mean-token-sum-norm", "matpo"])
def test_weights_do_not_depend_on_the_layout(rollout_batch, mode):
    _, _, seqs = _sequences(rollout_batch, queries=2, group=3, max_workers=2)
    config = default_loss(loss_agg=mode)
    packed = packing.pack_sequences(seqs, 64, loss_config=config)
    padded = packing.pad_sequences(seqs, 64, loss_config=config)
    for s in seqs:
        a = packed.loss_weights[packed.rollout_ids == s.rollout_id]
        b = padded.loss_weights[padded.rollout_ids == s.rollout_id]
        np.testing.assert_array_equal(a, b)
    if mode in ("token-mean", "matpo", "seq-mean-token-mean"):
        assert packed.loss_weights.sum() == pytest.approx(1.0, rel=1e-6)  # a proper mean


def test_row_length_search_removes_the_mostly_empty_last_row():
    rng = np.random.default_rng(1)
    seqs = [packing.TrainSequence(np.ones(n, np.int32), np.ones(n, bool), np.zeros(n, np.float32),
                                  0.0, 0, i, i)
            for i, n in enumerate([1000, 900, 700, 650] + list(rng.integers(100, 300, 12)))]
    fixed = packing.pack_sequences(seqs, 1024, loss_config=LOSS)
    searched = packing.pack_sequences(seqs, 2048, row_len_multiple=128, loss_config=LOSS)
    assert searched.shape[1] % 128 == 0 and searched.shape[1] >= 1000
    assert searched.efficiency() > fixed.efficiency()
    assert searched.num_loss_tokens() == fixed.num_loss_tokens()


def test_reference_logprobs_travel_with_their_tokens():
    seqs = [packing.TrainSequence(np.arange(n, dtype=np.int32), np.ones(n, bool),
                                  np.zeros(n, np.float32), 1.0, 0, i, i,
                                  ref_logprobs=np.full(n, -float(i + 1), np.float32))
            for i, n in enumerate([5, 3, 7])]
    batch = packing.pack_sequences(seqs, 8, loss_config=LOSS)
    for s in seqs:
        np.testing.assert_array_equal(batch.ref_logprobs[batch.rollout_ids == s.rollout_id],
                                      s.ref_logprobs)
    assert packing.pack_sequences([dataclasses.replace(s, ref_logprobs=None) for s in seqs],
                                  8, loss_config=LOSS).ref_logprobs is None


def test_sequences_without_gradient_are_left_out_only_when_inert():
    seqs = [packing.TrainSequence(np.ones(n, np.int32), np.ones(n, bool), np.zeros(n, np.float32),
                                  adv, 0, i, i)
            for i, (n, adv) in enumerate([(6, 0.0), (5, 1.0), (4, 0.0), (7, -1.0)])]
    lean = packing.pack_sequences(seqs, 16, drop_inert=True, loss_config=LOSS)
    assert sorted(set(lean.rollout_ids[lean.rollout_ids >= 0].tolist())) == [1, 3]
    full = packing.pack_sequences(seqs, 16, loss_config=LOSS)
    for i in (1, 3):  # the kept sequences' weights count the dropped ones' tokens too
        np.testing.assert_array_equal(lean.loss_weights[lean.rollout_ids == i],
                                      full.loss_weights[full.rollout_ids == i])
    # A KL or entropy term gives every sequence a gradient: nothing is left out.
    for config in (default_loss(kl_coef=0.1), default_loss(entropy_coef=0.01)):
        assert packing.trained_indices(seqs, config) == [0, 1, 2, 3]
    # All inert: the shortest stays, so the batch is never empty.
    quiet = [dataclasses.replace(s, advantage=0.0) for s in seqs]
    assert packing.trained_indices(quiet, LOSS) == [2]


@pytest.mark.parametrize("mini,micro", [(1, 4), (2, 2), (2, 4)])
def test_rows_in_use_fill_whole_micro_batches_within_their_mini_batch(rollout_batch, mini, micro):
    _, _, seqs = _sequences(rollout_batch, queries=3, group=3, max_workers=3)
    groups, rows = mini * micro, 32
    batch = packing.pack_sequences(seqs, 64, rows=rows, loss_config=LOSS)
    filled = packing.fill_micro_batches_first(batch, mini, micro)
    # A permutation of whole rows (every leaf moved alike), each row within its mini-batch.
    key = lambda b, r: (b.tokens[r].tobytes(), b.loss_weights[r].tobytes(),
                        b.rollout_ids[r].tobytes())
    assert sorted(key(filled, r) for r in range(rows)) == sorted(key(batch, r) for r in range(rows))
    source = {key(batch, r): r for r in range(rows) if batch.segment_ids[r].any()}
    for r in range(rows):
        if filled.segment_ids[r].any():
            assert (source[key(filled, r)] % groups) // micro == (r % groups) // micro
    # Micro-batch k of mini m holds rows {j * groups + m * micro + k} (trainer/step._split_rows):
    # per mini-batch, its rows in use occupy the fewest micro-batches, the first ones.
    used = filled.segment_ids.any(axis=1).reshape(rows // groups, mini, micro)
    per_micro = rows // groups
    for m in range(mini):
        in_use = int(used[:, m].sum())
        busy = used[:, m].any(axis=0)
        assert busy.tolist() == [k < -(-in_use // per_micro) for k in range(micro)]
        assert used[:, m, :in_use // per_micro].all()
    busy_before = batch.segment_ids.any(axis=1).reshape(rows // groups, groups).any(axis=0)
    assert int(used.any(axis=0).sum()) < int(busy_before.sum())  # packing spread them out
    with pytest.raises(packing.PackingError, match="split into"):
        packing.fill_micro_batches_first(batch, 3, 1)
    setwise = dataclasses.replace(batch, set_row_delta=np.zeros_like(batch.tokens))
    with pytest.raises(packing.PackingError, match="setwise"):
        packing.fill_micro_batches_first(setwise, mini, micro)
