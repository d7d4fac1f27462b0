"""The setwise ratio, rl.ratio=setwise (SRPO; docs/METHOD.md section 5.1): the hand-computed
check vector, sets kept whole in one micro-batch by the packing, exactness over micro-batches and
devices, and the loss against an independent reference from per-token log-probs."""
import collections
import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from matpo_jax import parallel
from matpo_jax.agents.trajectory import PLANNER, WORKER, Rollout
from matpo_jax.rl import advantages, rewards
from matpo_jax.rl.batch import sequences_from_rollouts, set_turns
from matpo_jax.trainer import packing, setwise
from matpo_jax.trainer import step as ts
from matpo_jax.trainer.loss import clipped_surrogate, policy_objective, token_logprobs
from fixtures.losses import default_loss

LOSS = default_loss()  # the default experiment's loss

MAX_LEN, ROWS, CLASSES = 48, 16, 4
SETWISE = default_loss(ratio="setwise")


def test_set_turns_of_planner_runs_and_workers():
    planner = Rollout(0, PLANNER, 0, 0, None)
    for n, trainable in ((3, False), (2, True), (2, False), (3, True)):
        planner.append([5] * n, trainable=trainable)
    worker = Rollout(1, WORKER, 0, 0, 0, spawn_turn=0)
    worker.append([6] * 4, trainable=False)
    np.testing.assert_array_equal(set_turns(planner), [-1] * 3 + [0, 0] + [-1] * 2 + [1] * 3)
    np.testing.assert_array_equal(set_turns(worker), [0] * 4)
    with pytest.raises(ValueError, match="spawn_turn"):
        set_turns(Rollout(2, WORKER, 0, 0, 0))


def test_set_log_ratio_check_vector():
    # Two rows of 4. Set A: (0,1), (0,2) (a planner turn) and (1,1) (its worker), anchor (0,1);
    # set B: (0,3) alone. Log-ratios 0.3, -0.1, 0.4 -> A: 0.6 / sqrt(3) = 0.346410; B: 0.5.
    log_ratio = jnp.asarray([[0.0, 0.3, -0.1, 0.5], [0.0, 0.4, 0.0, 0.0]])
    mask = jnp.asarray([[0, 1, 1, 1], [0, 1, 0, 0]], jnp.float32)
    batch = types.SimpleNamespace(
        set_row_delta=jnp.asarray([[0, 0, 0, 0], [0, -1, 0, 0]], jnp.int32),
        set_col=jnp.asarray([[0, 1, 1, 3], [0, 1, 2, 3]], jnp.int32))
    out = np.asarray(setwise.set_log_ratios(log_ratio, mask, batch, stride=1))
    a = 0.6 / np.sqrt(3)
    np.testing.assert_allclose(out[[0, 0, 1], [1, 2, 1]], [a, a, a], rtol=1e-6)
    np.testing.assert_allclose(out[0, 3], 0.5, rtol=1e-6)
    # One clip per set: with A = -1, rho_A = exp(0.346410) = 1.413982 > 1.2 stays unclipped
    # (max(1.413982, 1.2)); with A = +1 it is clipped to -1.2 on all three members.
    loss, clipped = clipped_surrogate(jnp.asarray(out), 0.0, -jnp.ones((2, 4)), 0.2, 0.2, 3.0)
    np.testing.assert_allclose(np.asarray(loss)[0, 1], np.exp(a), rtol=1e-6)
    loss, clipped = clipped_surrogate(jnp.asarray(out), 0.0, jnp.ones((2, 4)), 0.2, 0.2, 3.0)
    np.testing.assert_allclose(np.asarray(loss)[[0, 0, 1], [1, 2, 1]], [-1.2] * 3, rtol=1e-6)
    assert bool(np.asarray(clipped)[1, 1])


def _rollouts(rollout_batch, seed=5):
    rollouts, golds = rollout_batch(seed=seed, queries=2, group=3, max_workers=2)
    for r in rollouts:  # the fixture's planners sample two turns; spread the workers over both
        if r.role == WORKER:
            r.spawn_turn = r.rollout_id % 2
    return rollouts, golds


@pytest.fixture(scope="module")
def sequences(rollout_batch):
    rollouts, golds = _rollouts(rollout_batch)
    reward = rewards.rewards_by_id(rewards.rollout_rewards(rollouts, golds))
    return sequences_from_rollouts(rollouts, advantages.assign_advantages(rollouts, reward),
                                           with_sets=True)


def _pack(seqs, classes=CLASSES):
    return packing.pack_sequences(seqs, MAX_LEN, rows=ROWS, row_multiple=CLASSES,
                                  loss_config=SETWISE, set_classes=classes)


def test_every_group_lies_in_one_residue_class_and_sets_share_an_anchor(sequences):
    batch = _pack(sequences)
    by_id = {s.rollout_id: s for s in sequences}
    classes_of = collections.defaultdict(set)
    anchors = collections.defaultdict(set)
    for row, col in zip(*np.nonzero(batch.segment_ids)):
        seq = by_id[int(batch.rollout_ids[row, col])]
        classes_of[seq.group_id].add(row % CLASSES)
        turn = int(seq.set_turns[batch.positions[row, col]])
        if turn >= 0:
            anchors[seq.group_id, turn].add((row + batch.set_row_delta[row, col],
                                             batch.set_col[row, col]))
    assert all(len(c) == 1 for c in classes_of.values())
    assert len({c for cs in classes_of.values() for c in cs}) > 1  # groups spread over classes
    assert all(len(a) == 1 for a in anchors.values())
    assert any(s.role_id == 1 for s in sequences)


def test_setwise_loss_matches_an_independent_reference(sequences, tiny_model):
    batch = _pack(sequences)
    logits = tiny_model(jnp.asarray(batch.tokens), jnp.asarray(batch.positions),
                        jnp.asarray(batch.segment_ids))
    logp = np.asarray(token_logprobs(logits, jnp.asarray(batch.tokens),
                                     jnp.asarray(batch.segment_ids))[0], np.float64)
    # Perturb the old log-probs so the ratios are far from 1 and some sets clip.
    rng = np.random.default_rng(0)
    batch.old_logprobs = (logp - rng.normal(0, 0.3, logp.shape)).astype(np.float32)
    by_id = {s.rollout_id: s for s in sequences}
    mask = batch.loss_mask > 0
    members = collections.defaultdict(list)
    for row, col in zip(*np.nonzero(mask)):
        seq = by_id[int(batch.rollout_ids[row, col])]
        members[seq.group_id, int(seq.set_turns[batch.positions[row, col]])].append((row, col))
    expected = 0.0
    for cells in members.values():
        rows, cols = np.asarray(cells).T
        log_ratio = (logp[rows, cols] - batch.old_logprobs[rows, cols]).sum() / np.sqrt(len(cells))
        rho, adv = np.exp(log_ratio), batch.advantages[rows[0], cols[0]]
        assert np.all(batch.advantages[rows, cols] == adv)  # one advantage per set
        loss = max(-adv * rho, -adv * np.clip(rho, 0.8, 1.2))
        if adv < 0:
            loss = min(loss, -adv * 3.0)
        expected += loss * batch.loss_weights[rows, cols].sum()
    assert len(members) > len(sequences) // 2
    got, _ = policy_objective(jnp.asarray(logp, jnp.float32), jnp.zeros_like(logits[..., 0]),
                              jax.tree.map(jnp.asarray, batch), SETWISE)
    np.testing.assert_allclose(float(got), expected, rtol=1e-5)
    token, _ = policy_objective(jnp.asarray(logp, jnp.float32), jnp.zeros_like(logits[..., 0]),
                                jax.tree.map(jnp.asarray, batch), LOSS)
    assert abs(float(token) - expected) > 1e-4  # the two ratios really differ here


def test_singleton_sets_are_the_token_ratio(sequences, tiny_model):
    batch = _pack(sequences)
    batch.set_row_delta = np.zeros_like(batch.set_row_delta)  # every token its own set
    batch.set_col = np.tile(np.arange(batch.shape[1], dtype=np.int32), (batch.shape[0], 1))
    rng = np.random.default_rng(1)
    logp = jnp.asarray(batch.old_logprobs + rng.normal(0, 0.3, batch.shape), jnp.float32)
    args = (logp, jnp.zeros_like(logp), jax.tree.map(jnp.asarray, batch))
    np.testing.assert_allclose(float(policy_objective(*args, SETWISE)[0]),
                               float(policy_objective(*args, LOSS)[0]), rtol=1e-6)


@pytest.fixture(scope="module")
def meshes():
    return {1: parallel.make_mesh(devices=jax.devices()[:1]),
            8: parallel.make_mesh(data=2, fsdp=2, tensor=2)}


def test_setwise_is_exact_over_micro_batches_and_devices(tiny_model, sequences, meshes):
    batch = _pack(sequences)
    results = {}
    for devices, micro in ((1, 1), (8, 1), (8, 2), (8, 4)):
        graphdef, state, shardings = ts.init_train_state(tiny_model, optax.sgd(0.1),
                                                         meshes[devices])
        grads_of = ts.make_gradient_fn(graphdef, ts.TrainStepConfig(loss=SETWISE,
                                                                    micro_batches=micro),
                                       meshes[devices], shardings)
        loss, grads, _ = grads_of(state, batch)
        results[devices, micro] = (float(loss), [np.asarray(g) for g in jax.tree.leaves(grads)])
    ref_loss, ref_grads = results[1, 1]
    assert abs(ref_loss) > 0
    scale = max(float(np.abs(g).max()) for g in ref_grads)
    for loss, grads in results.values():
        np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
        for g, r in zip(grads, ref_grads):
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6 * scale)


def test_packing_without_classes_would_split_sets(sequences):
    # The plain layout puts some group's rows in different residue classes: a 4-micro-batch step
    # would then see part of a set. class packing is what prevents it.
    plain = packing.pack_sequences(sequences, MAX_LEN, rows=ROWS, loss_config=LOSS)
    by_id = {s.rollout_id: s for s in sequences}
    classes_of = collections.defaultdict(set)
    for row, col in zip(*np.nonzero(plain.segment_ids)):
        classes_of[by_id[int(plain.rollout_ids[row, col])].group_id].add(row % CLASSES)
    assert any(len(c) > 1 for c in classes_of.values())
    with pytest.raises(packing.PackingError, match="set_turns"):
        packing.pack_sequences([dataclass_without_sets(s) for s in sequences], MAX_LEN, rows=ROWS,
                               row_multiple=CLASSES, set_classes=CLASSES, loss_config=LOSS)


def dataclass_without_sets(seq):
    return dataclasses.replace(seq, set_turns=None)


def test_the_rl_batch_packs_sets_and_refuses_per_role_advantages(rollout_batch):
    from matpo_jax.config import ConfigError, apply_overrides, base_config, to_typed
    from matpo_jax.rl import batch as batch_lib
    rollouts, golds = _rollouts(rollout_batch, seed=7)
    reward = rewards.rewards_by_id(rewards.rollout_rewards(rollouts, golds))
    out = batch_lib.matpo_batch(rollouts, reward, loss_config=SETWISE, pack_len=MAX_LEN,
                                row_multiple=CLASSES, set_classes=CLASSES)
    assert out.batch.set_row_delta is not None and out.batch.shape[0] % CLASSES == 0
    assert (out.batch.set_row_delta % CLASSES == 0).all()  # anchors in the token's own class
    with pytest.raises(ValueError, match="rl.group_by"):
        batch_lib.matpo_batch(rollouts, reward, loss_config=SETWISE, pack_len=MAX_LEN,
                              row_multiple=CLASSES, set_classes=CLASSES, group_by="agent")
    with pytest.raises(ConfigError, match="rl.group_by"):
        to_typed(apply_overrides(base_config(), {"rl.ratio": "setwise", "rl.group_by": "role"}),
                 check_files=False)
