"""Training-path attention: causal attention within packed segments, flash-style.

Memory is linear in the sequence length: query blocks loop over the key blocks from the first
one their segments reach to the diagonal, with an online softmax, and the backward recomputes
each block's probabilities from the saved per-row log-normaliser instead of keeping them. Nothing of size [T, T] is ever live; the largest
temporaries are one [block, block] score tile per (batch, kv head, group).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from matpo_jax.model.cached_attention import MASKED_SCORE, cached_attention


def grouped_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """`cached_attention` with token-major k, v [B, S, K, D] (the dense reference of
    packed_attention): q [B, T, H, D], mask [B, T, S] bool -> [B, T, H * D]."""
    return cached_attention(q, k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3), mask)


# Query- and key-block size of the packed training attention. 128 keeps the per-block matmuls
# MXU-aligned on TPU and was fastest (with 64) on CPU fwd+bwd at T=1024 (benchmarks/attention.py).
ATTENTION_BLOCK = 128


def _tile(x, start, size, axis):
    return jax.lax.dynamic_slice_in_dim(x, start, size, axis=axis)


def _block_bias(seg_q, seg_k, q_start, k_start, group, prefix_q=None):
    """Additive score bias of one (query block, key block) tile: 0 where the query may attend
    (not later, and the same segment or the shared prefix its segment continues), MASKED_SCORE
    elsewhere. seg_q, seg_k, prefix_q: [B, block] -> [B, 1, group * block, block] float32
    (queries laid out group-major, as the q tiles)."""
    block = seg_q.shape[1]
    q_pos = q_start + jnp.arange(block, dtype=jnp.int32)
    k_pos = k_start + jnp.arange(block, dtype=jnp.int32)
    visible = seg_q[:, :, None] == seg_k[:, None, :]
    if prefix_q is not None:
        visible |= (prefix_q[:, :, None] == seg_k[:, None, :]) & (prefix_q > 0)[:, :, None]
    allowed = (q_pos[:, None] >= k_pos[None, :])[None] & visible
    bias = jnp.where(allowed, 0.0, MASKED_SCORE).astype(jnp.float32)  # [B, block, block]
    bias = jnp.broadcast_to(bias[:, None], (bias.shape[0], group, block, block))
    return bias.reshape(bias.shape[0], 1, group * block, block)


def key_block_starts(segment_ids: jax.Array, block: int,
                     prefix_ids: jax.Array | None = None) -> jax.Array:
    """[T // block] int32: for each query block, the first key block that any of its queries
    (in any row) may attend. A query attends only keys of its own segment id and of its shared
    prefix's (prefix_ids), none before the first position of either in the row, so the key blocks
    before that one are masked for every query of the block: they add exact zeros to the online
    softmax (a later real key's correction factor is exp(-1e30) = 0) and to every gradient, and
    skipping them changes no bit of a non-padding output. Padding queries (id 0, whose outputs
    `packed_attention` replaces) do not hold a block back; a block is never started after its own
    diagonal. Ids outside [0, T]: every block starts at key block 0, as without the skip."""
    batch, length = segment_ids.shape
    position = jnp.arange(length, dtype=jnp.int32)
    in_range = (segment_ids >= 0) & (segment_ids <= length)
    if prefix_ids is not None:
        in_range &= (prefix_ids >= 0) & (prefix_ids <= length)
    ids = jnp.where(in_range, segment_ids, 0)
    first = jax.vmap(lambda s: jax.ops.segment_min(position, s, num_segments=length + 1))(ids)
    first_of_query = jnp.take_along_axis(first, ids, axis=1)  # [B, T]
    if prefix_ids is not None:
        prefixes = jnp.where(in_range, prefix_ids, 0)
        first_of_prefix = jnp.take_along_axis(first, prefixes, axis=1)
        first_of_query = jnp.where(prefixes > 0, jnp.minimum(first_of_query, first_of_prefix),
                                   first_of_query)
    first_of_query = jnp.where(ids == 0, length, first_of_query)  # padding: no constraint
    blocks = length // block
    starts = jnp.min(first_of_query.reshape(batch, blocks, block), axis=(0, 2)) // block
    starts = jnp.minimum(starts, jnp.arange(blocks, dtype=jnp.int32))
    return jnp.where(jnp.all(in_range), starts, 0).astype(jnp.int32)


def _q_tile(x, start, block):
    """Rows [start, start + block) of x [B, K, G, T, ...] as [B, K, G * block, ...]."""
    tile = _tile(x, start, block, axis=3)
    return tile.reshape(tile.shape[0], tile.shape[1], -1, *tile.shape[4:])


def _scores(q_tile, k_tile, bias):
    return jnp.einsum("bkmd,bksd->bkms", q_tile, k_tile,
                      preferred_element_type=jnp.float32) + bias


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _flash(q, k, v, segment_ids, prefix_ids, block):
    """q [B, K, G, T, D] (already scaled by 1/sqrt(D)), k, v [B, K, T, D], segment_ids and
    prefix_ids (or None) [B, T] with T a multiple of `block` -> out [B, K, G, T, D]."""
    return _flash_fwd(q, k, v, segment_ids, prefix_ids, block)[0]


def _prefix_tile(prefix_ids, start, block):
    return None if prefix_ids is None else _tile(prefix_ids, start, block, axis=1)


def _flash_fwd(q, k, v, segment_ids, prefix_ids, block):
    batch, kv_heads, group, length, head_dim = q.shape
    rows = group * block
    starts = key_block_starts(segment_ids, block, prefix_ids)

    def query_block(i, carry):
        out, log_norm = carry
        lo = i * block
        q_i, seg_q = _q_tile(q, lo, block), _tile(segment_ids, lo, block, axis=1)
        prefix_q = _prefix_tile(prefix_ids, lo, block)

        def key_block(j, acc):
            running_max, total, acc_out = acc
            k_lo = j * block
            bias = _block_bias(seg_q, _tile(segment_ids, k_lo, block, axis=1), lo, k_lo, group,
                               prefix_q)
            scores = _scores(q_i, _tile(k, k_lo, block, axis=2), bias)
            new_max = jnp.maximum(running_max, jnp.max(scores, axis=-1))
            correction = jnp.exp(running_max - new_max)
            weights = jnp.exp(scores - new_max[..., None])
            total = total * correction + jnp.sum(weights, axis=-1)
            acc_out = acc_out * correction[..., None] + jnp.einsum(
                "bkms,bksd->bkmd", weights.astype(v.dtype), _tile(v, k_lo, block, axis=2),
                preferred_element_type=jnp.float32)
            return new_max, total, acc_out

        init = (jnp.full((batch, kv_heads, rows), -jnp.inf, jnp.float32),
                jnp.zeros((batch, kv_heads, rows), jnp.float32),
                jnp.zeros((batch, kv_heads, rows, head_dim), jnp.float32))
        # Keys after the query block are all causally masked: the loop stops at the diagonal;
        # keys before its segments' first positions are masked too: it starts there.
        running_max, total, acc_out = jax.lax.fori_loop(starts[i], i + 1, key_block, init)
        out_i = (acc_out / total[..., None]).astype(out.dtype)
        out = jax.lax.dynamic_update_slice_in_dim(
            out, out_i.reshape(batch, kv_heads, group, block, head_dim), lo, axis=3)
        log_norm = jax.lax.dynamic_update_slice_in_dim(
            log_norm, (running_max + jnp.log(total)).reshape(batch, kv_heads, group, block), lo,
            axis=3)
        return out, log_norm

    out, log_norm = jax.lax.fori_loop(
        0, length // block, query_block,
        (jnp.zeros(q.shape, v.dtype), jnp.zeros(q.shape[:-1], jnp.float32)))
    return out, (q, k, v, segment_ids, prefix_ids, out, log_norm)


def _flash_bwd(block, residuals, d_out):
    q, k, v, segment_ids, prefix_ids, out, log_norm = residuals
    batch, kv_heads, group, length, head_dim = q.shape
    # Softmax backward: dS = P * (dP - rowsum(P * dP)) and rowsum(P * dP) = rowsum(dO * O).
    delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
    # the forward's: skipped tiles add zeros
    starts = key_block_starts(segment_ids, block, prefix_ids)

    def query_block(i, carry):
        dq, dk, dv = carry
        lo = i * block
        q_i, do_i = _q_tile(q, lo, block), _q_tile(d_out.astype(v.dtype), lo, block)
        norm_i, delta_i = _q_tile(log_norm, lo, block), _q_tile(delta, lo, block)
        seg_q = _tile(segment_ids, lo, block, axis=1)
        prefix_q = _prefix_tile(prefix_ids, lo, block)

        def key_block(j, acc):
            dq_i, dk, dv = acc
            k_lo = j * block
            k_j, v_j = _tile(k, k_lo, block, axis=2), _tile(v, k_lo, block, axis=2)
            bias = _block_bias(seg_q, _tile(segment_ids, k_lo, block, axis=1), lo, k_lo, group,
                               prefix_q)
            probs = jnp.exp(_scores(q_i, k_j, bias) - norm_i[..., None])  # recomputed, f32
            dv_j = jnp.einsum("bkms,bkmd->bksd", probs.astype(v.dtype), do_i,
                              preferred_element_type=jnp.float32)
            dp = jnp.einsum("bkmd,bksd->bkms", do_i, v_j, preferred_element_type=jnp.float32)
            ds = (probs * (dp - delta_i[..., None])).astype(q.dtype)
            dq_i = dq_i + jnp.einsum("bkms,bksd->bkmd", ds, k_j,
                                     preferred_element_type=jnp.float32)
            dk_j = jnp.einsum("bkms,bkmd->bksd", ds, q_i, preferred_element_type=jnp.float32)
            dk = jax.lax.dynamic_update_slice_in_dim(dk, _tile(dk, k_lo, block, 2) + dk_j, k_lo, 2)
            dv = jax.lax.dynamic_update_slice_in_dim(dv, _tile(dv, k_lo, block, 2) + dv_j, k_lo, 2)
            return dq_i, dk, dv

        dq_i = jnp.zeros((batch, kv_heads, group * block, head_dim), jnp.float32)
        dq_i, dk, dv = jax.lax.fori_loop(starts[i], i + 1, key_block, (dq_i, dk, dv))
        dq = jax.lax.dynamic_update_slice_in_dim(
            dq, dq_i.reshape(batch, kv_heads, group, block, head_dim), lo, axis=3)
        return dq, dk, dv

    zeros_kv = jnp.zeros(k.shape, jnp.float32)
    dq, dk, dv = jax.lax.fori_loop(0, length // block, query_block,
                                   (jnp.zeros(q.shape, jnp.float32), zeros_kv, zeros_kv))
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def packed_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array,
                     block: int = ATTENTION_BLOCK,
                     prefix_ids: jax.Array | None = None) -> jax.Array:
    """Causal attention within equal segment ids (0 = padding), flash-style.

    prefix_ids [B, T] int (optional): the id of a shared prefix, an earlier segment of the row
    that a token's segment continues (0: none). Its tokens also attend that segment's keys, so
    several sequences with one prompt hold the prompt's tokens once (trainer/packing.py).

    q: [B, T, H, D]; k, v: [B, T, K, D]; segment_ids: [B, T] int. Returns [B, T, H * D], equal
    (up to float summation order) to `grouped_attention` with the dense packed mask. Query block
    [lo, hi) visits key blocks up to hi only (later keys are causally masked and contribute
    exactly 0), so about half the [T, T] work is skipped, and starts at the key block of its
    segments' first positions (`key_block_starts`: earlier keys belong to other sequences of the
    row, so that skip is exact to the bit); keys are not repeated: each query block
    is laid out [B, kv_heads, group * block, D] so both products are plain batched matmuls.
    Memory: O(T) residuals (q, k, v, out, a float32 log-normaliser per query row) plus one score
    tile per loop step, in the forward and in the backward (which recomputes the probabilities).
    Padding rows (segment 0) get, as in the dense path (uniform softmax over all T keys), the
    mean of v over the row. A length that `block` does not divide is padded up to one.
    """
    batch, length, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads
    block = min(block, length)
    padded = -(-length // block) * block
    segment_ids = segment_ids.astype(jnp.int32)
    pad_rows = ((0, 0), (0, padded - length))

    def pad(x):
        return jnp.pad(x, pad_rows + ((0, 0),) * (x.ndim - 2))

    q_s = q * jnp.asarray(head_dim ** -0.5, q.dtype)
    q_s = pad(q_s).reshape(batch, padded, kv_heads, group, head_dim).transpose(0, 2, 3, 1, 4)
    k_t, v_t = pad(k).transpose(0, 2, 1, 3), pad(v).transpose(0, 2, 1, 3)  # [B, K, T, D]
    prefix_ids = None if prefix_ids is None else pad(prefix_ids.astype(jnp.int32))
    out = _flash(q_s, k_t, v_t, pad(segment_ids), prefix_ids, block)
    out = out[:, :, :, :length].transpose(0, 3, 1, 2, 4)  # [B, T, K, G, D]
    mean_v = jnp.mean(v.astype(jnp.float32), axis=1).astype(out.dtype)[:, None, :, None, :]
    out = jnp.where((segment_ids != 0)[:, :, None, None, None], out, mean_v)
    return out.reshape(batch, length, heads * head_dim)
