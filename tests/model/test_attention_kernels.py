"""The attention kernels (model.attention.train) against the dense reference, on the CPU in Pallas
interpret mode: values and gradients of q, k and v, on packed rows that exercise every mask rule
(several segments per row, causality, segments continuing a shared prompt through prefix_ids,
padding, a length no block divides). cuDNN's kernel needs a GPU: its call is checked here with
JAX's own implementation behind the same API (same mask, same layout)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from matpo_jax.model.attention_dispatch import train_attention, padding_rows_as_reference
from matpo_jax.model.gpu_attention import cudnn_packed_attention, pallas_gpu_packed_attention
from matpo_jax.model.packed_attention import grouped_attention
from matpo_jax.model.splash_attention import splash_packed_attention

BATCH, LENGTH, HEADS, KV_HEADS, HEAD_DIM = 2, 200, 4, 2, 16  # 200: padded to 256 inside


def _row(spans):
    """[(segment, prefix, length), ...] -> (segment ids, prefix ids) of one row of LENGTH."""
    seg = np.concatenate([np.full(n, s) for s, _, n in spans])
    pre = np.concatenate([np.full(n, p) for _, p, n in spans])
    assert len(seg) == LENGTH
    return seg, pre


# Row 0: prompt 1 continued by segments 2 and 3, then segment 4 alone, then padding. Row 1: a
# prompt 7 continued by 9, then 5 alone, padding between. Segments cross the 128-token blocks.
ROWS = [_row([(1, 0, 40), (2, 1, 50), (3, 1, 60), (4, 0, 30), (0, 0, 20)]),
        _row([(7, 0, 90), (0, 0, 10), (9, 7, 70), (5, 0, 30)])]
SEGMENTS = jnp.asarray(np.stack([r[0] for r in ROWS]), jnp.int32)
PREFIXES = jnp.asarray(np.stack([r[1] for r in ROWS]), jnp.int32)


@pytest.fixture(scope="module")
def qkv():
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (BATCH, LENGTH, HEADS, HEAD_DIM))
    k = jax.random.normal(keys[1], (BATCH, LENGTH, KV_HEADS, HEAD_DIM))
    v = jax.random.normal(keys[2], (BATCH, LENGTH, KV_HEADS, HEAD_DIM))
    cotangent = jax.random.normal(keys[3], (BATCH, LENGTH, HEADS * HEAD_DIM))
    return q, k, v, cotangent


def dense_reference(q, k, v, segment_ids, prefix_ids):
    """Softmax over the dense packed mask; padding queries (segment 0) attend nothing, so they
    get the mean of v (a uniform softmax over the row), as in packed_attention."""
    seg = np.asarray(segment_ids)
    pre = np.zeros_like(seg) if prefix_ids is None else np.asarray(prefix_ids)
    same = seg[:, :, None] == seg[:, None, :]
    into_prompt = (pre[:, :, None] == seg[:, None, :]) & (pre > 0)[:, :, None]
    causal = np.tril(np.ones((LENGTH, LENGTH), bool))
    mask = (same | into_prompt) & causal & (seg != 0)[:, :, None]
    return grouped_attention(q, k, v, jnp.asarray(mask))


def _values_and_grads(attention, q, k, v, cotangent):
    out, vjp = jax.vjp(attention, q, k, v)
    return (out, *vjp(cotangent))


def _assert_matches_reference(kernel, qkv, prefix_ids):
    q, k, v, cotangent = qkv
    got = _values_and_grads(kernel, q, k, v, cotangent)
    want = _values_and_grads(lambda q, k, v: dense_reference(q, k, v, SEGMENTS, prefix_ids),
                             q, k, v, cotangent)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=2e-5,
                                   err_msg=name)


@pytest.mark.parametrize("with_prompts", [False, True], ids=["segments", "shared_prompts"])
def test_splash_equals_the_dense_reference(qkv, with_prompts):
    prefix_ids = PREFIXES if with_prompts else None

    def kernel(q, k, v):
        out = splash_packed_attention(q, k, v, SEGMENTS, prefix_ids, interpret=True)
        return padding_rows_as_reference(out, v, SEGMENTS)

    _assert_matches_reference(kernel, qkv, prefix_ids)


def test_pallas_gpu_equals_the_dense_reference(qkv):
    def kernel(q, k, v):
        out = pallas_gpu_packed_attention(q, k, v, SEGMENTS, interpret=True)
        return padding_rows_as_reference(out, v, SEGMENTS)

    _assert_matches_reference(kernel, qkv, None)


@pytest.mark.parametrize("with_prompts", [False, True], ids=["segments", "shared_prompts"])
def test_the_cudnn_call_expresses_every_mask_rule(qkv, with_prompts):
    prefix_ids = PREFIXES if with_prompts else None

    def kernel(q, k, v):
        out = cudnn_packed_attention(q, k, v, SEGMENTS, prefix_ids, implementation="xla")
        return padding_rows_as_reference(out, v, SEGMENTS)

    _assert_matches_reference(kernel, qkv, prefix_ids)


def test_the_prompt_rule_changes_the_answer(qkv):
    # The rows above make the shared-prompt rule matter: without it the outputs differ (so the
    # equality tests with prompts could not pass by ignoring prefix_ids).
    q, k, v, _ = qkv
    with_rule = dense_reference(q, k, v, SEGMENTS, PREFIXES)
    without = dense_reference(q, k, v, SEGMENTS, None)
    assert float(jnp.max(jnp.abs(with_rule - without))) > 0.1


def test_the_dispatcher_runs_splash_with_prompts_like_the_xla_path(qkv):
    q, k, v, cotangent = qkv
    got = _values_and_grads(
        lambda q, k, v: train_attention(q, k, v, SEGMENTS, PREFIXES, "splash"), q, k, v,
        cotangent)
    want = _values_and_grads(
        lambda q, k, v: train_attention(q, k, v, SEGMENTS, PREFIXES, "xla"), q, k, v, cotangent)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=2e-5,
                                   err_msg=name)
