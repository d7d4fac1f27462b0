"""Training-path attention: causal attention within packed segments, computed block-causally.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from matpo_jax.model.cached_attention import MASKED_SCORE, cached_attention


def grouped_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """`cached_attention` with token-major k, v [B, S, K, D] (the dense reference of
    packed_attention): q [B, T, H, D], mask [B, T, S] bool -> [B, T, H * D]."""
    return cached_attention(q, k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3), mask)


# Query-block size of the packed training attention. 128 keeps the per-block matmuls MXU-aligned
# on TPU and was fastest (with 64) on CPU fwd+bwd at T=1024 (benchmarks/attention.py).
ATTENTION_BLOCK = 128


def _transposed(x):
    """x with its last two axes swapped, as its own array: the barrier keeps XLA from folding the
    transpose back into the consuming dot (which it would then feed from a strided copy of the
    much larger [M, S] operand instead)."""
    return jax.lax.optimization_barrier(jnp.swapaxes(x, -1, -2))


@jax.custom_vjp
def _attend_block(q, k, v, bias):
    """Softmax attention of one query block: q [B, K, M, D] (M = group * block rows, already
    scaled by 1/sqrt(D)), k, v [B, K, S, D], bias [B, 1, M, S] float32 (0 = may attend,
    MASKED_SCORE = masked). Returns [B, K, M, D].

    Hand-written VJP (the flash-attention backward, with the probabilities saved rather than
    recomputed): the automatic one took ~1.5x longer on CPU, mostly in extra passes over the
    [M, S] scores. The mask is an additive bias so XLA fuses it into the scores' matmul."""
    return _attend_block_fwd(q, k, v, bias)[0]


def _attend_block_fwd(q, k, v, bias):
    scores = jnp.einsum("bkmd,bksd->bkms", q, k, preferred_element_type=jnp.float32) + bias
    weights = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))  # unnormalised
    inv_norm = 1.0 / jnp.sum(weights, axis=-1, keepdims=True)
    out = jnp.einsum("bkms,bksd->bkmd", weights.astype(v.dtype), v,
                     preferred_element_type=jnp.float32) * inv_norm
    # Materialised once: otherwise XLA recomputes weights @ v inside the backward's fusion.
    out = jax.lax.optimization_barrier(out.astype(v.dtype))
    return out, (q, k, v, weights, inv_norm, out)


def _attend_block_bwd(residuals, d_out):
    q, k, v, weights, inv_norm, out = residuals
    d_out32 = d_out.astype(jnp.float32)
    # Softmax backward: dS = P * (dP - rowsum(P * dP)) and rowsum(P * dP) = rowsum(dO * O).
    delta = jnp.sum(d_out32 * out.astype(jnp.float32), axis=-1, keepdims=True)
    d_scaled = (d_out32 * inv_norm).astype(v.dtype)
    dv = jnp.einsum("bkdm,bkms->bkds", _transposed(d_scaled), weights.astype(v.dtype),
                    preferred_element_type=jnp.float32)
    dp = jnp.einsum("bkmd,bksd->bkms", d_out, v, preferred_element_type=jnp.float32)
    ds = (weights * inv_norm * (dp - delta)).astype(q.dtype)
    dq = jnp.einsum("bkms,bksd->bkmd", ds, k, preferred_element_type=jnp.float32)
    dk = jnp.einsum("bkdm,bkms->bkds", _transposed(q), ds, preferred_element_type=jnp.float32)
    return (dq.astype(q.dtype), jnp.swapaxes(dk, -1, -2).astype(k.dtype),
            jnp.swapaxes(dv, -1, -2).astype(v.dtype), None)


_attend_block.defvjp(_attend_block_fwd, _attend_block_bwd)


def packed_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array,
                     block: int = ATTENTION_BLOCK) -> jax.Array:
    """Causal attention within equal segment ids (0 = padding), computed block-causally.

    q: [B, T, H, D]; k, v: [B, T, K, D]; segment_ids: [B, T] int. Returns [B, T, H * D], equal
    (up to float summation order) to `grouped_attention` with the dense packed mask: query block
    [lo, hi) only attends to keys [0, hi), because every later key is causally masked and a masked
    score contributes exactly 0 to the softmax. That skips the blocks above the diagonal (about
    half the work at T = 1024) and never materialises a [B, K, G, T, T] score. Keys are not
    repeated: each query block is laid out [B, kv_heads, group * block, D] so both products are
    plain batched matmuls. Padding rows (segment 0) attend to nothing; as in the dense path
    (uniform softmax over all T keys) they get the mean of v over the row.
    """
    batch, length, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads
    q = q * jnp.asarray(head_dim ** -0.5, q.dtype)
    q = q.reshape(batch, length, kv_heads, group, head_dim).transpose(0, 2, 3, 1, 4)
    k_t, v_t = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, K, T, D]
    positions = jnp.arange(length, dtype=jnp.int32)
    outs = []
    for lo in range(0, length, block):
        hi = min(lo + block, length)
        seg_q = segment_ids[:, lo:hi]
        mask = ((positions[lo:hi, None] >= positions[None, :hi])[None]
                & (seg_q[:, :, None] == segment_ids[:, None, :hi]))  # [B, rows, hi]
        bias = jnp.where(mask, 0.0, MASKED_SCORE).astype(jnp.float32)
        bias = jnp.broadcast_to(bias[:, None, None], (batch, 1, group, hi - lo, hi))
        out = _attend_block(q[:, :, :, lo:hi].reshape(batch, kv_heads, group * (hi - lo), head_dim),
                            k_t[:, :, :hi], v_t[:, :, :hi],
                            bias.reshape(batch, 1, group * (hi - lo), hi))
        outs.append(out.reshape(batch, kv_heads, group, hi - lo, head_dim))
    out = jnp.concatenate(outs, axis=3).transpose(0, 3, 1, 2, 4)  # [B, T, K, G, D]
    pad = jnp.mean(v.astype(jnp.float32), axis=1).astype(out.dtype)[:, None, :, None, :]
    out = jnp.where((segment_ids != 0)[:, :, None, None, None], out, pad)
    return out.reshape(batch, length, heads * head_dim)
