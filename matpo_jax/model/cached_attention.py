"""Attention of new queries over an explicit heads-major KV cache (prefill, extend, decode).

Per layer (see `decoder.KVCache`) keys are stored slot-minor [B, kv_heads, D, S] and values
[B, kv_heads, S, D]: in a decode step both reductions (over D for the scores, over S for the
output) then run over a major axis with a contiguous minor one, i.e. as vector updates. Queries
are grouped [kv_heads, group] so K/V are never repeated.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

# Finite "minus infinity": a fully masked row (padding) softmaxes to uniform instead of NaN.
MASKED_SCORE = -1e30


def cached_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Softmax attention over a heads-major cache, without repeating K/V: queries are viewed as
    [kv_heads, group].

    q: [B, T, H, D]; k: [B, K, D, S]; v: [B, K, S, D]; mask: [B, T, S] bool (True = may attend).
    Returns [B, T, H * D].
    """
    batch, q_len, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    if q_len == 1:  # a decode step
        return _decode_attention(q, k, v, mask)
    q = q.reshape(batch, q_len, kv_heads, heads // kv_heads, head_dim)
    # Slot-major keys for the dot (only references and tests take this dense multi-token path;
    # XLA CPU has no bf16 x bf16 -> f32 dot contracting a major axis).
    keys = jnp.swapaxes(k, 2, 3)
    scores = jnp.einsum("btkgd,bksd->bkgts", q, keys, preferred_element_type=jnp.float32)
    scores = scores * (head_dim ** -0.5)
    scores = jnp.where(mask[:, None, None, :, :], scores, MASKED_SCORE)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bksd->btkgd", probs, v)
    return out.reshape(batch, q_len, heads * head_dim)


# Key-block size of `blocked_cached_attention` (multi-token extends over a cache).
CACHE_BLOCK = 128


def blocked_cached_attention(q: jax.Array, k: jax.Array, v: jax.Array, positions: jax.Array,
                             lengths: jax.Array, block: int = CACHE_BLOCK) -> jax.Array:
    """`cached_attention` for a multi-token extend, reading only the filled part of the cache.

    q: [B, T, H, D]; k [B, K, D, S], v [B, K, S, D]: the cache (new tokens already written);
    positions: [B, T] each query's slot; lengths: [B] filled slots after the write. Query (b, t)
    attends slot s iff s <= positions[b, t] and s < lengths[b] (the dense mask of `extend`).
    Keys are visited in blocks of `block` slots with an online softmax, in a loop that stops at
    the longest row's length: a prompt written into a fresh 4096-slot row reads its own few
    hundred slots, not all 4096. Returns [B, T, H * D]; query rows that may attend nothing
    (padding past num_valid, whose output is ignored) get the mean of the visited values.
    """
    batch, q_len, heads, head_dim = q.shape
    kv_heads, max_len = v.shape[1], v.shape[2]
    group = heads // kv_heads
    block = min(block, max_len)
    rows = group * q_len  # query row m = g * T + t, so both products are plain batched matmuls
    qg = q.reshape(batch, q_len, kv_heads, group, head_dim).transpose(0, 2, 3, 1, 4)
    qg = qg.reshape(batch, kv_heads, rows, head_dim)
    limit = jnp.minimum(positions, lengths[:, None] - 1)  # last slot each query may attend
    limit = jnp.broadcast_to(limit[:, None, :], (batch, group, q_len)).reshape(batch, 1, rows)
    scale = head_dim ** -0.5
    num_blocks = jnp.minimum((jnp.max(lengths) + block - 1) // block, -(-max_len // block))

    def visit(index, carry):
        top, total, acc = carry
        # The last block is shifted back to stay in bounds; slots seen before are masked.
        start = jnp.minimum(index * block, max_len - block)
        k_block = jax.lax.dynamic_slice_in_dim(k, start, block, axis=3)
        v_block = jax.lax.dynamic_slice_in_dim(v, start, block, axis=2)
        slots = start + jnp.arange(block, dtype=jnp.int32)
        valid = (slots >= index * block)[None, None, :] & (slots[None, None, :] <= limit[..., None])
        scores = jnp.einsum("bkmd,bkds->bkms", qg, k_block, preferred_element_type=jnp.float32)
        scores = jnp.where(valid, scores * scale, MASKED_SCORE)
        new_top = jnp.maximum(top, jnp.max(scores, axis=-1))
        probs = jnp.exp(scores - new_top[..., None])
        correction = jnp.exp(top - new_top)
        total = total * correction + jnp.sum(probs, axis=-1)
        acc = acc * correction[..., None] + jnp.einsum(
            "bkms,bksd->bkmd", probs.astype(v.dtype), v_block, preferred_element_type=jnp.float32)
        return new_top, total, acc

    init = (jnp.full((batch, kv_heads, rows), MASKED_SCORE, jnp.float32),
            jnp.zeros((batch, kv_heads, rows), jnp.float32),
            jnp.zeros((batch, kv_heads, rows, head_dim), jnp.float32))
    _, total, acc = jax.lax.fori_loop(0, num_blocks, visit, init)
    out = (acc / jnp.maximum(total, 1e-30)[..., None]).astype(q.dtype)
    out = out.reshape(batch, kv_heads, group, q_len, head_dim).transpose(0, 3, 1, 2, 4)
    return out.reshape(batch, q_len, heads * head_dim)


def _decode_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """`cached_attention` of one query per row, as broadcast products and sums rather than dots:
    with a handful of query rows per (batch, kv head) the batched dots run as B * K tiny
    matrix-vector products, while the elementwise form fuses into one pass over the cache (2-3x
    faster on CPU at B = 32). With k slot-minor, the score sum over D adds whole rows of S
    (1.5-2x faster than summing each slot's D lane). q: [B, 1, H, D]; k: [B, K, D, S];
    v: [B, K, S, D]; mask [B, 1, S]."""
    batch, _, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    q = q.reshape(batch, kv_heads, heads // kv_heads, head_dim, 1).astype(jnp.float32)
    scores = jnp.sum(q * k[:, :, None].astype(jnp.float32), axis=3)  # [B, K, G, S]
    scores = jnp.where(mask[:, None], scores * (head_dim ** -0.5), MASKED_SCORE)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.sum(probs[..., None] * v[:, :, None].astype(jnp.float32), axis=3)  # [B, K, G, D]
    return out.astype(v.dtype).reshape(batch, 1, heads * head_dim)
