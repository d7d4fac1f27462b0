"""The objective against docs/METHOD.md section 10, plus the next-token shift and per-role metrics."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from matpo_jax.trainer import loss as loss_lib
from matpo_jax.trainer.packing import PackedBatch
from fixtures.losses import default_loss


@pytest.mark.parametrize("advantage, rho, expected", [
    (+1, 1.5, -1.28), (+1, 0.5, -0.5), (-1, 4.0, 3.0), (-1, 0.5, 0.8), (-1, 1.1, 1.1)])
def test_clipped_surrogate_check_vectors(advantage, rho, expected):
    logp = jnp.log(jnp.float32(rho))
    value, _ = loss_lib.clipped_surrogate(logp, jnp.float32(0.0), jnp.float32(advantage),
                                          eps_low=0.2, eps_high=0.28, dual_clip=3.0)
    assert float(value) == pytest.approx(expected, abs=1e-6)


def test_clip_indicator_and_ratio_guard():
    rho = jnp.array([1.5, 0.5, 4.0, 1.0])
    adv = jnp.array([1.0, -1.0, -1.0, 1.0])
    value, clipped = loss_lib.clipped_surrogate(jnp.log(rho), 0.0, adv, 0.2, 0.2, 3.0)
    np.testing.assert_array_equal(clipped, [True, True, True, False])
    # A wildly stale token: the log-ratio is clipped at 20, so the loss stays finite.
    value, _ = loss_lib.clipped_surrogate(jnp.float32(500.0), 0.0, jnp.float32(1.0), 0.2, 0.2, 3.0)
    assert np.isfinite(float(value))


L = [np.array([1.0, 2.0, 0.0]), np.array([3.0, 0.0, 0.0])]
M = [np.array([1.0, 1.0, 0.0]), np.array([1.0, 0.0, 0.0])]


def _aggregate(mode, group_ids=(0, 1), role_ids=(0, 0), **kw):
    weights = loss_lib.aggregation_weights(M, list(group_ids), list(role_ids), mode,
                                           norm_constant=3, **kw)
    return sum(float((w * l).sum()) for w, l in zip(weights, L))


@pytest.mark.parametrize("mode, expected", [
    ("token-mean", 2.0), ("seq-mean-token-sum", 3.0), ("seq-mean-token-mean", 2.25),
    ("seq-mean-token-sum-norm", 2.0)])
def test_aggregation_check_vectors(mode, expected):
    assert _aggregate(mode) == pytest.approx(expected)


def test_matpo_aggregation_and_planner_denominator():
    # Row 0 a planner, row 1 its worker: one group of 3 tokens -> (1+2+3)/3.
    assert _aggregate("matpo", group_ids=(0, 0), role_ids=(0, 1)) == pytest.approx(2.0)
    # Two separate planners: (1/2) * ((1+2)/2 + 3/1).
    assert _aggregate("matpo", group_ids=(0, 1)) == pytest.approx(2.25)
    # Reference-release denominator: one planner rollout, so sequence sums are not halved.
    assert _aggregate("seq-mean-token-sum", group_ids=(0, 0), role_ids=(0, 1),
                      seq_denominator="planners") == pytest.approx(6.0)
    assert _aggregate("seq-mean-token-mean", group_ids=(0, 0), role_ids=(0, 1),
                      seq_denominator="planners") == pytest.approx(4.5)
    with pytest.raises(ValueError, match="aggregation mode"):
        _aggregate("sum")


def test_empty_sequences_do_not_count_in_the_sequence_mean():
    masks = M + [np.zeros(3)]
    weights = loss_lib.aggregation_weights(masks, [0, 1, 2], [0, 0, 1], "seq-mean-token-sum")
    assert sum(float((w * l).sum()) for w, l in zip(weights, L + [np.ones(3)])) == 3.0


def test_next_token_shift_never_crosses_segments():
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(1, 6, 5)), jnp.float32)
    tokens = jnp.array([[1, 2, 3, 4, 0, 0]])
    segments = jnp.array([[1, 1, 2, 2, 0, 0]])
    logp, entropy, predictable = loss_lib.token_logprobs(logits, tokens, segments, True)
    np.testing.assert_array_equal(predictable, [[False, True, False, True, False, False]])
    log_softmax = jax.nn.log_softmax(logits[0], axis=-1)
    np.testing.assert_allclose(logp[0, 1], log_softmax[0, 2], rtol=1e-6)  # token 2 from logits 0
    np.testing.assert_allclose(logp[0, 3], log_softmax[2, 4], rtol=1e-6)  # token 4 from logits 2
    assert float(logp[0, 2]) == 0.0  # first token of segment 2: not scored from segment 1
    probs = jnp.exp(log_softmax[2])
    np.testing.assert_allclose(entropy[0, 3], -(probs * log_softmax[2]).sum(), rtol=1e-5)


def test_kl_estimators():
    logp, ref = jnp.float32(-1.0), jnp.float32(-1.5)
    assert float(loss_lib.kl_penalty(logp, ref, "k1")) == pytest.approx(0.5)
    assert float(loss_lib.kl_penalty(logp, ref, "low_var_kl")) == pytest.approx(
        np.exp(-0.5) + 0.5 - 1.0, rel=1e-6)
    assert float(loss_lib.kl_penalty(ref, ref, "low_var_kl")) == 0.0


def _toy_batch(advantages, roles, mask, weights):
    shape = (1, len(mask))
    f = lambda x: jnp.asarray(np.reshape(x, shape), jnp.float32)  # noqa: E731
    return PackedBatch(tokens=jnp.zeros(shape, jnp.int32), positions=jnp.zeros(shape, jnp.int32),
                       segment_ids=jnp.ones(shape, jnp.int32),
                       role_ids=jnp.asarray(np.reshape(roles, shape), jnp.int32), loss_mask=f(mask),
                       advantages=f(advantages), old_logprobs=jnp.zeros(shape),
                       loss_weights=f(weights), rollout_ids=jnp.zeros(shape, jnp.int32),
                       ref_logprobs=jnp.zeros(shape))


def test_policy_loss_metrics_split_by_role_and_kl_entropy_terms():
    # Uniform logits over 4 tokens: logp = -log 4 for every token; old logp 0 -> rho = 1/4.
    logits = jnp.zeros((1, 5, 4))
    batch = _toy_batch(advantages=[0, 1, 1, -1, -1], roles=[0, 0, 0, 1, 1], mask=[0, 1, 1, 1, 1],
                       weights=[0, .25, .25, .25, .25])
    value, sums = loss_lib.policy_loss(logits, batch, default_loss())
    # A=+1, rho=.25 -> max(-.25, -.8) = -.25; A=-1 -> max(.25, .8) = .8
    assert float(value) == pytest.approx(0.25 * (2 * -0.25 + 2 * 0.8))
    metrics = loss_lib.finalize_metrics(sums)
    assert float(metrics["planner/tokens"]) == 2 and float(metrics["worker/tokens"]) == 2
    assert float(metrics["planner/pg_loss"]) == pytest.approx(-0.25)
    assert float(metrics["worker/pg_loss"]) == pytest.approx(0.8)
    assert float(metrics["worker/clip_frac"]) == 1.0 and float(metrics["planner/clip_frac"]) == 0
    assert float(metrics["worker/advantage"]) == -1.0
    assert float(metrics["planner/entropy"]) == pytest.approx(np.log(4), rel=1e-6)
    with_terms = default_loss(kl_coef=0.1, kl_type="k1", entropy_coef=0.01)
    value2, _ = loss_lib.policy_loss(logits, batch, with_terms)
    # k1 = logp - ref = -log 4 on every token; entropy = log 4; weights sum to 1.
    assert float(value2) == pytest.approx(float(value) - 0.1 * np.log(4) - 0.01 * np.log(4),
                                          rel=1e-5)
