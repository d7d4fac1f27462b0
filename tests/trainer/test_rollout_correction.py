"""Rollout-train mismatch (METHOD 5.2): the sampler's log-probs of its tokens are not the train
step's, measured and corrected by truncated importance sampling (rl.rollout_correction).

The check vector is computed by hand; the mismatch is a real one: the jitted sampler decodes in
bfloat16 with a KV cache, the step recomputes in float32 with packed attention."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from matpo_jax import parallel
from matpo_jax.model import CausalLM
from matpo_jax.sampler.loop import Sampling, generate
from matpo_jax.trainer import loss as loss_lib
from matpo_jax.trainer import packing
from matpo_jax.trainer import step as ts
from fixtures.losses import default_loss
from fixtures.rl_batches import tiny_model_config

# One row, four tokens: the first cannot be predicted (no loss), three carry loss.
SAMPLER = np.array([[0.0, -1.0, -2.0, -0.5]], np.float32)     # log pi_sampler (recorded)
RECOMPUTED = np.array([[0.0, -0.8, -2.5, -0.5]], np.float32)  # log pi_step at the same params
CURRENT = np.array([[0.0, -0.7, -2.4, -0.6]], np.float32)     # log pi_step after an update
ADVANTAGE, CAP = 1.5, 1.1


def _vector_batch():
    ones = np.ones((1, 4), np.float32)
    mask = np.array([[0, 1, 1, 1]], np.float32)
    return packing.PackedBatch(
        tokens=np.zeros((1, 4), np.int32), positions=np.arange(4, dtype=np.int32)[None],
        segment_ids=np.ones((1, 4), np.int32), role_ids=np.zeros((1, 4), np.int32),
        loss_mask=mask, advantages=ADVANTAGE * ones, old_logprobs=SAMPLER,
        loss_weights=ones / 3, rollout_ids=np.zeros((1, 4), np.int32),
        recomputed_logprobs=RECOMPUTED)


def _loss(correction, batch=None):
    config = default_loss(rollout_correction=correction, tis_cap=CAP, eps_low=0.2,
                          eps_high=0.2, dual_clip_c=3.0)
    batch = batch or _vector_batch()
    loss, sums = loss_lib.policy_objective(jnp.asarray(CURRENT), jnp.zeros((1, 4)), batch, config)
    return float(loss), {k: float(v) for k, v in loss_lib.finalize_metrics(sums).items()}


def test_check_vector_by_hand():
    """A = 1.5, eps 0.2 both ways, weights 1/3, tis_cap 1.1 (METHOD 5.2's worked example)."""
    # off (= measure): ratio against the sampler. rho = exp(0.3), exp(-0.4), exp(-0.1):
    # 1.3499 clips to 1.2; 0.6703 and 0.9048 stay (A > 0 keeps the smaller surrogate).
    want_off = -ADVANTAGE * (1.2 + np.exp(-0.4) + np.exp(-0.1)) / 3
    # tis: ratio against the recomputed log-probs. rho = exp(0.1), exp(0.1), exp(-0.1), none
    # clipped; weights min(exp(0.2), 1.1) = 1.1 (capped), exp(-0.5) = 0.6065, exp(0) = 1.
    want_tis = -ADVANTAGE * (1.1 * np.exp(0.1) + np.exp(-0.5) * np.exp(0.1) + np.exp(-0.1)) / 3
    got_off, metrics_off = _loss("off")
    got_measure, _ = _loss("measure")
    got_tis, metrics_tis = _loss("tis")
    np.testing.assert_allclose([got_off, got_measure, got_tis], [want_off, want_off, want_tis],
                               rtol=1e-6)
    np.testing.assert_allclose([got_off, got_tis], [-1.387579, -1.395423], atol=1e-6)  # METHOD
    assert metrics_tis["planner/tis_capped_frac"] == pytest.approx(1 / 3)
    assert metrics_tis["planner/tis_weight"] == pytest.approx((1.1 + np.exp(-0.5) + 1) / 3)
    assert "planner/tis_weight" not in metrics_off
    assert metrics_off["planner/clip_frac"] == pytest.approx(1 / 3)
    assert metrics_tis["planner/clip_frac"] == 0.0


def test_mismatch_statistics_by_hand():
    stats = {k: float(v) for k, v in loss_lib.rollout_mismatch(
        jnp.asarray(SAMPLER), jnp.asarray(RECOMPUTED), jnp.asarray(_vector_batch().loss_mask)
    ).items()}
    r = np.array([0.2, -0.5, 0.0])  # step - sampler on the loss tokens
    assert stats["mismatch/abs_mean"] == pytest.approx(0.7 / 3)
    assert stats["mismatch/abs_max"] == pytest.approx(0.5)
    assert stats["mismatch/kl"] == pytest.approx(np.mean(np.exp(r) - 1 - r))
    assert stats["mismatch/tokens"] == 3


def test_a_correction_without_recomputed_logprobs_is_refused():
    batch = dataclasses.replace(_vector_batch(), recomputed_logprobs=None)
    for correction in ("measure", "tis"):
        with pytest.raises(ValueError, match="recomputed_logprobs"):
            _loss(correction, batch)
    with pytest.raises(ValueError, match="tis_cap"):
        default_loss(tis_cap=0.5)


# ------------------------------------------------------------- a real mismatch: bf16 sampler
MAX_LEN, NEW_TOKENS = 32, 12
PROMPTS = [[5, 9, 2], [17, 3, 3, 40], [64], [8, 100, 7]]


@pytest.fixture(scope="module")
def bf16_rollouts(tiny_model):
    """Tokens and log-probs from the jitted slot sampler decoding in bfloat16 (the float32
    parameters, computed in bfloat16 with a bfloat16 KV cache), packed as an RL batch."""
    bf16 = CausalLM(dataclasses.replace(tiny_model_config(), dtype="bfloat16"),
                            rngs=nnx.Rngs(0))
    graphdef_bf16, _ = nnx.split(bf16)
    _, params = nnx.split(tiny_model)
    tokens, logprobs = generate(params, graphdef_bf16, PROMPTS, NEW_TOKENS,
                                Sampling(temperature=1.0, max_turn_tokens=NEW_TOKENS),
                                rng=jax.random.key(7))
    seqs = []
    for i, (prompt, new, logp) in enumerate(zip(PROMPTS, tokens, logprobs)):
        ids = np.concatenate([prompt, new]).astype(np.int32)
        trainable = np.arange(len(ids)) >= len(prompt)
        old = np.zeros(len(ids), np.float32)
        old[trainable] = np.asarray(logp, np.float32)[: trainable.sum()]
        seqs.append(packing.TrainSequence(tokens=ids, trainable=trainable, old_logprobs=old,
                                          advantage=1.0 if i % 2 else -1.0, role_id=0,
                                          rollout_id=i, group_id=i))
    return seqs


def test_bf16_sampler_vs_f32_step_is_measured_and_tis_keeps_it_out_of_the_trust_region(
        tiny_model, bf16_rollouts):
    """Uncapped TIS leaves the loss at the sampling parameters unchanged (pi/pi_s = pi/pi_r x
    pi_r/pi_s); what it changes is where the trust region sits and how large a weight can get.
    With a clip range narrower than the mismatch (as bf16 against f32 is on a large model at
    eps 0.2), the uncorrected ratio clips tokens before any update, by numerics alone."""
    mesh = parallel.make_mesh(devices=jax.devices()[:1])
    eps, cap = 2e-4, 1.0 + 2e-4
    results = {}
    for correction in ("off", "tis"):
        loss_config = default_loss(rollout_correction=correction, tis_cap=cap, eps_low=eps,
                                   eps_high=eps)
        config = ts.TrainStepConfig(loss=loss_config, micro_batches=2)
        graphdef, state, shardings = ts.init_train_state(tiny_model, optax.sgd(0.0), mesh)
        batch = packing.pack_sequences(bf16_rollouts, MAX_LEN, rows=4, loss_config=loss_config)
        recompute = ts.make_logprob_fn(graphdef, config, mesh, shardings)
        batch.recomputed_logprobs = recompute(state.params, state.frozen, batch)
        loss, grads, metrics = ts.make_gradient_fn(graphdef, config, mesh, shardings)(state, batch)
        results[correction] = (float(loss), {k: float(v) for k, v in metrics.items()}, grads)

    mismatch = {k: float(v) for k, v in loss_lib.rollout_mismatch(
        batch.old_logprobs, batch.recomputed_logprobs, batch.loss_mask).items()}
    # bfloat16 decoding really differs from the float32 step, by a bf16-sized amount.
    assert 1e-4 < mismatch["mismatch/abs_mean"] < 0.1 and mismatch["mismatch/kl"] > 0
    assert mismatch["mismatch/tokens"] == len(PROMPTS) * NEW_TOKENS

    loss_off, metrics_off, grads_off = results["off"]
    loss_tis, metrics_tis, grads_tis = results["tis"]
    # off: the ratio at the sampling parameters is the mismatch (approx_kl is mismatch/kl),
    # and it clips tokens; tis: the ratio is 1, nothing clipped, the gap is a capped weight.
    np.testing.assert_allclose(metrics_off["planner/approx_kl"], mismatch["mismatch/kl"],
                               rtol=0.05)
    assert metrics_tis["planner/approx_kl"] < 1e-3 * mismatch["mismatch/kl"]
    assert metrics_off["planner/clip_frac"] > 0.1 and metrics_tis["planner/clip_frac"] == 0
    assert 0 < metrics_tis["planner/tis_capped_frac"] < 1
    mask, w, adv = batch.loss_mask, batch.loss_weights, batch.advantages
    gap = np.exp(batch.recomputed_logprobs - batch.old_logprobs)
    want_off = np.sum(w * mask * np.maximum(-adv * gap, -adv * np.clip(gap, 1 - eps, 1 + eps)))
    want_tis = np.sum(w * mask * -adv * np.minimum(gap, cap))  # rho = 1: -A x weight
    np.testing.assert_allclose([loss_off, loss_tis], [want_off, want_tis], rtol=1e-4, atol=1e-7)
    # Clipped tokens give no gradient without the correction; with it every token pulls.
    differs = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                  for a, b in zip(jax.tree.leaves(grads_off), jax.tree.leaves(grads_tis)))
    assert differs > 1e-4
