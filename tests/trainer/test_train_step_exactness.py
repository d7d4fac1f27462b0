"""The sharded train step: exact aggregation under any micro-batch/device split, packed == padded,
non-finite updates skipped, mini-batch/epoch counting, and the SFT objective."""
import dataclasses

import jax
import numpy as np
import optax
import pytest

from matpo_jax import parallel
from matpo_jax.rl import advantages, rewards
from matpo_jax.rl.batch import sequences_from_rollouts
from matpo_jax.trainer import packing
from matpo_jax.trainer import step as ts
from fixtures.losses import default_loss

LOSS = default_loss()  # the default experiment's loss

MAX_LEN, ROWS = 48, 16
LOSS_VARIANTS = [default_loss(loss_agg=m) for m in (
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "matpo")]
LOSS_VARIANTS.append(default_loss(loss_agg="seq-mean-token-mean", seq_mean_denominator="planners"))


@pytest.fixture(scope="module")
def sequences(rollout_batch):
    rollouts, golds = rollout_batch(seed=5, queries=2, group=3, max_workers=2)
    reward = rewards.rewards_by_id(rewards.rollout_rewards(rollouts, golds))
    seqs = sequences_from_rollouts(rollouts, advantages.assign_advantages(rollouts, reward))
    assert len(seqs) <= ROWS and max(map(len, seqs)) <= MAX_LEN
    return seqs


@pytest.fixture(scope="module")
def meshes():
    return {1: parallel.make_mesh(devices=jax.devices()[:1]),
            8: parallel.make_mesh(data=2, fsdp=2, tensor=2)}


@pytest.fixture(scope="module")
def states(tiny_model, meshes):
    tx = optax.sgd(0.1)  # any tx: the gradient functions never apply it
    return {n: ts.init_train_state(tiny_model, tx, mesh) for n, mesh in meshes.items()}


@pytest.fixture(scope="module")
def gradient_fns(meshes, states):
    def build(devices, micro):
        graphdef, _, shardings = states[devices]
        return ts.make_gradient_fn(graphdef, ts.TrainStepConfig(micro_batches=micro, loss=LOSS),
                                   meshes[devices], shardings)
    return {(d, m): build(d, m) for d, m in ((1, 1), (8, 1), (8, 2), (8, 4))}


def _assert_same(result, reference):
    loss, grads, _ = result
    ref_loss, ref_grads, _ = reference
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(ref_grads))
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-5, atol=1e-6 * scale)


@pytest.mark.parametrize("loss_config", LOSS_VARIANTS,
                         ids=lambda c: f"{c.loss_agg}/{c.seq_mean_denominator}")
def test_any_micro_batch_and_device_split_gives_the_same_loss_and_grads(
        sequences, states, gradient_fns, loss_config):
    batch = packing.pack_sequences(sequences, MAX_LEN, rows=ROWS, loss_config=loss_config)
    reference = gradient_fns[1, 1](states[1][1], batch)
    assert float(np.abs(reference[0])) > 0
    for devices, micro in ((8, 1), (8, 2), (8, 4)):
        _assert_same(gradient_fns[devices, micro](states[devices][1], batch), reference)
    # The padded layout of the same trajectories: same objective, same gradients.
    padded = packing.pad_sequences(sequences, MAX_LEN, rows=ROWS, loss_config=loss_config)
    assert padded.segment_ids.max() == 1 and batch.segment_ids.max() > 1
    _assert_same(gradient_fns[8, 2](states[8][1], padded), reference)


@pytest.mark.parametrize("loss_config", LOSS_VARIANTS[:2] + LOSS_VARIANTS[-1:],
                         ids=lambda c: f"{c.loss_agg}/{c.seq_mean_denominator}")
def test_leaving_out_zero_advantage_groups_keeps_loss_and_grads(
        sequences, states, gradient_fns, loss_config):
    # The first planner's group scored alike: advantage 0 for it and its workers.
    quiet = sequences[0].group_id
    seqs = [dataclasses.replace(s, advantage=0.0) if s.group_id == quiet else s for s in sequences]
    assert any(s.advantage != 0 for s in seqs)
    full = packing.pack_sequences(seqs, MAX_LEN, rows=ROWS, loss_config=loss_config)
    lean = packing.pack_sequences(seqs, MAX_LEN, rows=ROWS, loss_config=loss_config,
                                  drop_inert=True)
    kept = set(lean.rollout_ids[lean.rollout_ids >= 0].tolist())
    assert kept == {s.rollout_id for s in seqs if s.group_id != quiet}  # workers left out too
    assert lean.num_loss_tokens() < full.num_loss_tokens()
    _assert_same(gradient_fns[1, 1](states[1][1], lean), gradient_fns[1, 1](states[1][1], full))


def test_metrics_are_whole_batch_exact(sequences, states, gradient_fns):
    batch = packing.pack_sequences(sequences, MAX_LEN, rows=ROWS, loss_config=LOSS)
    _, _, whole = gradient_fns[1, 1](states[1][1], batch)
    _, _, split = gradient_fns[8, 4](states[8][1], batch)
    for key in whole:
        np.testing.assert_allclose(split[key], whole[key], rtol=1e-5, err_msg=key)
    planner_tokens = sum(int(s.trainable[1:].sum()) for s in sequences if s.role_id == 0)
    assert float(whole["planner/tokens"]) == planner_tokens
    assert float(whole["worker/tokens"]) == batch.num_loss_tokens() - planner_tokens


def _host(tree):
    return jax.tree.map(lambda x: np.array(x), tree)


def test_sharded_accumulated_update_matches_the_whole_batch_gradient(
        tiny_model, sequences, meshes, states, gradient_fns):
    batch = packing.pack_sequences(sequences, MAX_LEN, rows=ROWS, loss_config=LOSS)
    _, ref_grads, _ = gradient_fns[1, 1](states[1][1], batch)
    expected = jax.tree.map(lambda p, g: np.asarray(p) - 0.5 * np.asarray(g),
                            _host(states[1][1].params), ref_grads)
    tx = optax.sgd(0.5)
    graphdef, state, shardings = ts.init_train_state(tiny_model, tx, meshes[8])
    step = ts.make_train_step(graphdef, tx, ts.TrainStepConfig(micro_batches=4, loss=LOSS),
                              meshes[8], shardings)
    state, _ = step(state, batch)
    assert int(state.optimizer_steps) == 1 and int(state.step) == 1
    for a, b in zip(jax.tree.leaves(_host(state.params)), jax.tree.leaves(expected)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_non_finite_gradients_skip_the_update_and_are_counted(tiny_model, sequences, meshes):
    config = ts.OptimizerConfig(learning_rate=1e-2, schedule="warmup_cosine", warmup_steps=2)
    tx = ts.make_optimizer(config)
    graphdef, state, shardings = ts.init_train_state(tiny_model, tx, meshes[8])
    step = ts.make_train_step(graphdef, tx, ts.TrainStepConfig(micro_batches=2, loss=LOSS),
                              meshes[8], shardings, ts.learning_rate_schedule(config))
    good = packing.pack_sequences(sequences, MAX_LEN, rows=ROWS, loss_config=LOSS)
    bad = packing.pack_sequences(sequences, MAX_LEN, rows=ROWS, loss_config=LOSS)
    bad.old_logprobs[np.nonzero(bad.loss_mask)[0][0], np.nonzero(bad.loss_mask)[1][0]] = np.nan
    before_params, before_opt = _host(state.params), _host(state.opt_state)

    state, metrics = step(state, bad)
    assert int(metrics["skipped_updates"]) == 1 and int(state.skipped_steps) == 1
    assert int(state.optimizer_steps) == 0 and int(state.step) == 1
    for a, b in zip(jax.tree.leaves(_host(state.params)), jax.tree.leaves(before_params)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(jax.tree.leaves(_host(state.opt_state)), jax.tree.leaves(before_opt)):
        np.testing.assert_array_equal(a, b)

    state, metrics = step(state, good)
    assert int(metrics["skipped_updates"]) == 0 and int(state.optimizer_steps) == 1
    assert float(metrics["learning_rate"]) == pytest.approx(0.5e-2)  # warmup: 1 of 2 steps
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(_host(state.params)))
    assert any(not np.array_equal(a, b) for a, b in
               zip(jax.tree.leaves(_host(state.params)), jax.tree.leaves(before_params)))


def test_mini_batches_and_epochs_are_counted_optimizer_steps(tiny_model, sequences, meshes):
    tx = ts.make_optimizer(ts.OptimizerConfig(learning_rate=1e-3))
    config = ts.TrainStepConfig(micro_batches=2, ppo_mini_batches=2, ppo_epochs=2, loss=LOSS)
    assert config.row_multiple(meshes[8]) == 16 and config.optimizer_steps_per_call == 4
    graphdef, state, shardings = ts.init_train_state(tiny_model, tx, meshes[8])
    step = ts.make_train_step(graphdef, tx, config, meshes[8], shardings)
    batch = packing.pack_sequences(sequences, MAX_LEN, rows=ROWS, loss_config=LOSS)
    state, metrics = step(state, batch)
    assert int(state.optimizer_steps) == 4 and int(metrics["optimizer_steps"]) == 4
    with pytest.raises(ValueError, match="multiple"):
        step(state, packing.pack_sequences(sequences, MAX_LEN, rows=ROWS + 8, loss_config=LOSS))


def test_sft_objective_shares_the_step_and_learns(tiny_model, sequences, meshes):
    config = ts.OptimizerConfig(learning_rate=3e-2, weight_decay=0.0)
    tx = ts.make_optimizer(config)
    graphdef, state, shardings = ts.init_train_state(tiny_model, tx, meshes[8])
    step = ts.make_train_step(graphdef, tx,
                              ts.TrainStepConfig(objective="sft", micro_batches=2, loss=LOSS),
                              meshes[8], shardings)
    batch = packing.pack_sequences(sequences, MAX_LEN, rows=ROWS, loss_config=LOSS)
    losses = []
    for _ in range(4):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    assert losses[0] == pytest.approx(np.log(128), rel=0.05)  # ~uniform at initialisation
    assert losses[-1] < losses[0] - 0.1
    assert float(metrics["planner/tokens"]) + float(metrics["worker/tokens"]) == \
        batch.num_loss_tokens()


def test_all_padding_micro_batches_are_skipped_without_changing_the_update(
        sequences, states, gradient_fns, meshes):
    batch = packing.pack_sequences(sequences, MAX_LEN, rows=ROWS, loss_config=LOSS)
    filled = packing.fill_micro_batches_first(batch, 1, 4)
    in_use = int(filled.segment_ids.any(axis=1).sum())
    assert in_use <= ROWS // 2 and batch.segment_ids.any(axis=1).reshape(-1, 4).any(axis=0).all()
    reference = gradient_fns[1, 1](states[1][1], batch)
    # Same loss and gradients as the layout packing left (padding rows spread over every
    # micro-batch), up to the order of the sums.
    _assert_same(gradient_fns[8, 4](states[8][1], filled), reference)
    # Micro-batches 2 and 3 are all padding: the step over 16 rows in 4 micro-batches equals,
    # bit for bit, the step over micro-batches 0 and 1 alone (8 rows in 2 of the same shape).
    assert not filled.segment_ids.reshape(-1, 4, MAX_LEN)[:, 2:].any()
    half = jax.tree.map(lambda x: x.reshape(-1, 4, *x.shape[1:])[:, :2].reshape(-1, *x.shape[1:]),
                        filled)
    loss, grads, metrics = gradient_fns[8, 4](states[8][1], filled)
    half_loss, half_grads, half_metrics = gradient_fns[8, 2](states[8][1], half)
    assert float(loss) == float(half_loss)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(half_grads)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for key in metrics:
        assert float(metrics[key]) == float(half_metrics[key]), key


def test_reference_logprobs_with_all_padding_micro_batches_equal_one_micro_batch(
        sequences, states, meshes):
    """make_logprob_fn (the KL reference, rollout correction) over micro-batches of which the
    last two are all padding (the layout fill_micro_batches_first leaves, whose skip path runs
    there): the rows in use get the log-probs of one micro-batch over the whole batch, in their
    own rows, and the padding rows zeros. (Skipped or not, a padding row's log-probs are zeros,
    so this checks the skip path's results and row order, not that the skip happens.)"""
    batch = packing.fill_micro_batches_first(
        packing.pack_sequences(sequences, MAX_LEN, rows=ROWS, loss_config=LOSS), 1, 4)
    graphdef, state, shardings = states[8]

    def logprobs(micro):
        config = ts.TrainStepConfig(micro_batches=micro, loss=LOSS)
        return ts.make_logprob_fn(graphdef, config, meshes[8], shardings)(
            state.params, state.frozen, batch)

    got, one = logprobs(4), logprobs(1)
    in_use = batch.segment_ids.any(axis=1)
    padding_micro = np.arange(ROWS) % 4 >= 2  # row j * 4 + k is in micro-batch k
    assert in_use.any() and not in_use[padding_micro].any()
    np.testing.assert_array_equal(got[padding_micro], 0.0)
    np.testing.assert_allclose(got[in_use], one[in_use], rtol=1e-5, atol=1e-6)
    assert (got[in_use][batch.loss_mask[in_use] > 0] < 0).all()  # real log-probs, not zeros
