"""Decode attention over a paged KV cache (paged_cache.py) through the TPU Pallas paged-attention
kernel (`jax.experimental.pallas.ops.tpu.paged_attention`): a decode step reads, per row, only
the pages its length covers, in blocks of `pages_per_compute_block` pages, instead of every slot
up to the maximum context.

What the kernel does differently from the XLA reference (`paged_attention_reference`):
- it loads K and V as bfloat16 (its dequantize step casts them), so a float32 cache gets
  bfloat16-rounded keys and values; scores, softmax and the output accumulate in float32. On a
  TPU the cache is bfloat16 anyway; the tests compare against the reference on bf16-rounded K/V.
- it applies no softmax scale: the queries are scaled by 1/sqrt(head_dim) here.
- a row of length 0 has nothing to attend to (its output would divide by zero): lengths are
  clamped to >= 1 (an empty slot's output is ignored by the sampler anyway).
- one query per row (decode). Multi-token extends (prompts, tool responses) stay on the XLA path;
  the ragged kernel for them (`...tpu.ragged_paged_attention`) lowers for TPU but does not run
  in this jax's TPU interpret mode (a reshape of a kernel ref), so it cannot be checked here.
On a CPU the kernel runs in Pallas TPU interpret mode (`interpret=True`: slow, for tests).
"""
from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp

# Pages per compute block: the kernel's inner loop visits this many pages at a time.
BLOCK_CHOICES = (8, 4, 2, 1)


def pages_per_compute_block(pages_per_row: int, page_size: int) -> int:
    """The largest choice that divides the table width, preferring >= 512 tokens a block (a
    v5e/v5p core's MXU tile at head_dim 128) and never more than the row's pages."""
    fitting = [b for b in BLOCK_CHOICES if pages_per_row % b == 0]
    enough = [b for b in fitting if b * page_size >= 512]
    return min(enough) if enough else fitting[0]


def tpu_paged_decode_attention(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array,
                               page_table: jax.Array, lengths: jax.Array,
                               interpret: bool = False) -> jax.Array:
    """q [B, H, D] (one new token per row, already written to its pages); k/v_pages
    [kv_heads, num_pages, page_size, D]; page_table [B, pages_per_row] (unmapped entries may hold
    any value: they are clamped in range and lie past the row's length); lengths [B] tokens to
    attend. Returns [B, H, D] in q's dtype."""
    from jax.experimental.pallas import tpu as pltpu
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

    head_dim = q.shape[-1]
    num_pages, page_size = k_pages.shape[1], k_pages.shape[2]
    table = jnp.minimum(page_table, num_pages - 1)
    block = pages_per_compute_block(table.shape[1], page_size)
    scaled = (q.astype(jnp.float32) * head_dim ** -0.5).astype(q.dtype)
    context = pltpu.force_tpu_interpret_mode() if interpret else contextlib.nullcontext()
    with context:
        out = paged_attention(scaled, k_pages, v_pages, jnp.maximum(lengths, 1).astype(jnp.int32),
                              table, pages_per_compute_block=block)
    return out.astype(q.dtype)
