"""Packed training attention through the GPU kernels JAX ships: cuDNN's fused attention
(`jax.nn.dot_product_attention(implementation="cudnn")`) and the Triton-lowered Pallas kernel
(`jax.experimental.pallas.ops.gpu.attention.mha`).

cuDNN through the public API takes a dense boolean mask, so every rule (segments, causality, the
shared prompt) is expressed, at the price of a [B, 1, T, T] mask (turned into an additive bias
by JAX: T * T * 2 bytes per row in bfloat16, 3.4 GB at T = 40,960). The Pallas kernel compares
one segment-id array for queries and keys and applies causality itself: linear memory, but no
shared-prompt rule (a query would have to match two ids) and no grouped-query heads (k and v
are repeated to the query heads). Both return [B, T, H, D]; padding rows are the caller's.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

# The Pallas GPU kernel's default query/key block: lengths are padded to a multiple of it.
PALLAS_GPU_BLOCK = 128


def packed_mask(segment_ids: jax.Array, prefix_ids: jax.Array | None) -> jax.Array:
    """The dense packed-rows mask [B, 1, T, T] bool: causal, and the same segment id or the
    shared prompt segment the query's segment continues (as packed_attention's tiles)."""
    length = segment_ids.shape[1]
    position = jnp.arange(length)
    visible = segment_ids[:, :, None] == segment_ids[:, None, :]
    if prefix_ids is not None:
        visible |= ((prefix_ids[:, :, None] == segment_ids[:, None, :])
                    & (prefix_ids > 0)[:, :, None])
    return (visible & (position[:, None] >= position[None, :]))[:, None]


def cudnn_packed_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array,
                           prefix_ids: jax.Array | None = None,
                           implementation: str = "cudnn") -> jax.Array:
    """q: [B, T, H, D]; k, v: [B, T, K, D] (grouped-query heads natively). `implementation`
    "xla" runs the same call through JAX's own reference (what the CPU tests check)."""
    mask = packed_mask(segment_ids.astype(jnp.int32),
                       None if prefix_ids is None else prefix_ids.astype(jnp.int32))
    return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=implementation)


def pallas_gpu_packed_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                                segment_ids: jax.Array, interpret: bool = False) -> jax.Array:
    """q: [B, T, H, D]; k, v: [B, T, K, D]; segment_ids [B, T] (no shared-prompt rule: the
    dispatcher falls back where prefix_ids are given). `interpret` runs the kernel in Pallas
    interpret mode (any backend)."""
    from jax.experimental.pallas.ops.gpu import attention as gpu_attention
    batch, length, heads, head_dim = q.shape
    group = heads // k.shape[2]
    padded = -(-length // PALLAS_GPU_BLOCK) * PALLAS_GPU_BLOCK

    def pad(x):  # padding tokens get segment id 0: no real query reaches them
        return jnp.pad(x, ((0, 0), (0, padded - length)) + ((0, 0),) * (x.ndim - 2))

    k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
    out = gpu_attention.mha(pad(q), pad(k), pad(v), pad(segment_ids.astype(jnp.int32)),
                            sm_scale=head_dim ** -0.5, causal=True, interpret=interpret)
    return out[:, :length]
