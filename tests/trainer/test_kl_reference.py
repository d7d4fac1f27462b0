"""The KL term against a frozen reference policy: reference log-probs of a packed batch are the
loss's own log-probs under the reference parameters (row order kept through micro-batching); the
KL is 0 while the policy is the reference, positive after an update, and enters the gradient."""
import jax
import numpy as np
import optax
import pytest
from flax import nnx

from matpo_jax import parallel
from matpo_jax.rl import advantages, rewards
from matpo_jax.rl.batch import sequences_from_rollouts
from matpo_jax.trainer import packing
from matpo_jax.trainer import step as ts
from matpo_jax.trainer.loss import token_logprobs
from fixtures.losses import default_loss

MAX_LEN, ROWS = 48, 8


@pytest.fixture(scope="module")
def setup(tiny_model, rollout_batch):
    rollouts, golds = rollout_batch(seed=3, queries=2, group=2, max_workers=1)
    reward = rewards.rewards_by_id(rewards.rollout_rewards(rollouts, golds))
    seqs = sequences_from_rollouts(rollouts, advantages.assign_advantages(rollouts, reward))
    loss = default_loss(kl_coef=0.5, kl_type="low_var_kl")
    config = ts.TrainStepConfig(loss=loss, micro_batches=2)
    mesh = parallel.make_mesh(devices=jax.devices()[:1])
    graphdef, state, shardings = ts.init_train_state(tiny_model, optax.sgd(0.1), mesh)
    batch = packing.pack_sequences(seqs, MAX_LEN, rows=ROWS, loss_config=loss)
    return dict(graphdef=graphdef, state=state, batch=batch,
                logprobs=ts.make_logprob_fn(graphdef, config, mesh, shardings),
                grads=ts.make_gradient_fn(graphdef, config, mesh, shardings),
                shardings=shardings)


def test_reference_logprobs_are_the_losss_logprobs_in_row_order(setup):
    batch, state = setup["batch"], setup["state"]
    got = setup["logprobs"](state.params, state.frozen, batch)

    @jax.jit
    def whole_batch(params, frozen, tokens, positions, segment_ids):
        logits = nnx.merge(setup["graphdef"], params, frozen)(tokens, positions, segment_ids)
        return token_logprobs(logits, tokens, segment_ids)[0]

    want = np.asarray(whole_batch(state.params, state.frozen, batch.tokens, batch.positions,
                                  batch.segment_ids))
    assert got.shape == batch.shape
    # The loss reads the loss mask's positions only; the others are not computed (0).
    scored = batch.loss_mask != 0
    assert scored.any()
    np.testing.assert_allclose(got[scored], want[scored], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[~scored], 0.0)


def test_kl_is_zero_at_the_reference_positive_after_an_update_and_has_a_gradient(setup):
    s, batch, state = setup, setup["batch"], setup["state"]
    batch.ref_logprobs = s["logprobs"](state.params, state.frozen, batch)  # the RL start, frozen
    _, grads, metrics = s["grads"](state, batch)
    for role in ("planner", "worker"):
        assert abs(float(metrics[f"{role}/ref_kl"])) < 1e-6

    # One update away from the reference: the KL grows, and it pulls on the parameters.
    moved = jax.tree.map(lambda p, g: p - 0.5 * g, state.params, grads)
    moved = jax.device_put(moved, s["shardings"].params)
    updated = state.replace(params=moved)
    _, grads_kl, metrics = s["grads"](updated, batch)
    assert float(metrics["planner/ref_kl"]) > 1e-6 and float(metrics["worker/ref_kl"]) > 1e-6
    # The same loss with the reference moved onto the current policy: low_var_kl's gradient
    # vanishes there, so what differs is exactly the KL term's pull back to the reference.
    at_policy = packing.PackedBatch(**{**batch.__dict__,
                                       "ref_logprobs": s["logprobs"](moved, state.frozen, batch)})
    _, grads_no_pull, metrics = s["grads"](updated, at_policy)
    assert abs(float(metrics["planner/ref_kl"])) < 1e-6
    diff = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
               for a, b in zip(jax.tree.leaves(grads_kl), jax.tree.leaves(grads_no_pull)))
    assert diff > 1e-4
