"""Stability metrics of every RL step (docs/METHOD.md section 11): gradient norm per role,
gradient-norm spikes against the running median, advantage mean/std per role."""
import dataclasses
import math

import jax
import numpy as np
import optax
import pytest

from matpo_jax import parallel
from matpo_jax.agents.trajectory import PLANNER, WORKER, Rollout
from matpo_jax.rl import advantages, batch as batch_lib, rewards
from matpo_jax.rl.batch import sequences_from_rollouts
from matpo_jax.trainer import packing
from matpo_jax.trainer import step as ts
from matpo_jax.trainer.stability import SpikeCounter
from fixtures.losses import default_loss

LOSS = default_loss()  # the default experiment's loss

MAX_LEN, ROWS = 48, 8


def test_spike_counter_check_vector():
    counter = SpikeCounter()
    seen = [counter.update(x) for x in (1.0, 2.0, 1.0, 6.5, 1.0, float("nan"), 3.1, 4.6)]
    # Medians of the history before each step: -, 1, 1.5, 1, 1.5, 1, 1, 1.5 (nan never enters).
    # Spikes (> 3 x median, with 3 steps of history at least): 6.5 > 3, 3.1 > 3, 4.6 > 4.5.
    assert [s["grad_norm_spike"] for s in seen] == [0, 0, 0, 1, 0, 0, 1, 1]
    assert [s["grad_norm_spikes"] for s in seen] == [0, 0, 0, 1, 1, 1, 2, 3]
    assert seen[3]["grad_norm_median"] == 1.0 and seen[4]["grad_norm_median"] == 1.5
    assert math.isnan(seen[0]["grad_norm_median"])


def test_advantage_stats_per_role_check_vector():
    rollouts = [Rollout(0, PLANNER, 0, 0, None), Rollout(1, PLANNER, 0, 1, None),
                Rollout(2, WORKER, 0, 0, 0), Rollout(3, WORKER, 0, 0, 0),
                Rollout(4, WORKER, 0, 1, 1)]
    stats = batch_lib.advantage_stats(rollouts, {0: 1.0, 1: -1.0, 2: 1.0, 3: 1.0, 4: -1.0})
    assert stats["advantage_mean/planner"] == 0.0 and stats["advantage_std/planner"] == 1.0
    assert stats["advantage_mean/worker"] == pytest.approx(1 / 3)
    assert stats["advantage_std/worker"] == pytest.approx(np.sqrt(8 / 9))  # population std


@pytest.fixture(scope="module")
def packed(rollout_batch):
    rollouts, golds = rollout_batch(seed=5, queries=2, group=3, max_workers=2)
    reward = rewards.rewards_by_id(rewards.rollout_rewards(rollouts, golds))
    seqs = sequences_from_rollouts(rollouts, advantages.assign_advantages(rollouts, reward))
    return packing.pack_sequences(seqs, MAX_LEN, rows=ROWS, loss_config=LOSS)


def _only(batch, role_id):
    """The batch with the other role's tokens out of the weighted sum (their ratios unchanged)."""
    keep = (np.asarray(batch.role_ids) == role_id).astype(np.float32)
    return dataclasses.replace(batch, loss_weights=np.asarray(batch.loss_weights) * keep)


def test_role_grad_norms_are_the_norms_of_each_roles_share(tiny_model, packed):
    mesh = parallel.make_mesh(devices=jax.devices()[:1])
    tx = optax.sgd(0.0)
    graphdef, state, shardings = ts.init_train_state(tiny_model, tx, mesh)
    grads_of = ts.make_gradient_fn(graphdef, ts.TrainStepConfig(micro_batches=2, loss=LOSS), mesh,
                                   shardings)
    expected = {name: float(optax.global_norm(grads_of(state, batch)[1]))
                for name, batch in (("planner", _only(packed, 0)), ("worker", _only(packed, 1)),
                                    ("all", packed))}
    assert expected["planner"] > 0 and expected["worker"] > 0
    step = ts.make_train_step(graphdef, tx, ts.TrainStepConfig(micro_batches=2,
                                                               role_grad_norms=True, loss=LOSS),
                              mesh, shardings)
    _, metrics = step(state, packed)
    np.testing.assert_allclose(float(metrics["planner/grad_norm"]), expected["planner"], rtol=1e-5)
    np.testing.assert_allclose(float(metrics["worker/grad_norm"]), expected["worker"], rtol=1e-5)
    np.testing.assert_allclose(float(metrics["grad_norm"]), expected["all"], rtol=1e-5)


def test_role_grad_norms_are_off_by_default(tiny_model, packed):
    mesh = parallel.make_mesh(devices=jax.devices()[:1])
    tx = optax.sgd(0.0)
    graphdef, state, shardings = ts.init_train_state(tiny_model, tx, mesh)
    _, metrics = ts.make_train_step(graphdef, tx, ts.TrainStepConfig(loss=LOSS), mesh, shardings)(
        state, packed)
    assert "planner/grad_norm" not in metrics and "grad_norm" in metrics
    assert "planner/clip_frac" in metrics and "worker/clip_frac" in metrics
