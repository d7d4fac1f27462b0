"""Decode attention over a paged KV cache (paged_cache.py) through JAX's Pallas paged-attention
kernels, TPU (`jax.experimental.pallas.ops.tpu.paged_attention`) and GPU (`...gpu.paged_attention`,
Triton-lowered): a decode step reads, per row, only the pages its length covers, in blocks of
`pages_per_compute_block` pages, instead of every slot up to the maximum context.

What the TPU kernel does differently from the XLA reference (`paged_attention_reference`):
- it loads K and V as bfloat16 (its dequantize step casts them), so a float32 cache gets
  bfloat16-rounded keys and values; scores, softmax and the output accumulate in float32. On a
  TPU the cache is bfloat16 anyway; the tests compare against the reference on bf16-rounded K/V.
- it applies no softmax scale: the queries are scaled by 1/sqrt(head_dim) here.
- a row of length 0 has nothing to attend to (its output would divide by zero): lengths are
  clamped to >= 1 (an empty slot's output is ignored by the sampler anyway).
- one query per row (decode). Multi-token extends (prompts, tool responses) stay on the XLA path;
  the ragged kernel for them (`...tpu.ragged_paged_attention`) lowers for TPU but does not run
  in this jax's TPU interpret mode (a reshape of a kernel ref), so it cannot be checked here.
- the kernel prefetches the whole page table into the core's scalar memory (SMEM, 1 MiB on v5e /
  v5p): 512 rows of a 40,960-token table in 64-token pages (1.25 MiB) do not compile. Rows are
  therefore attended in groups whose table fits `SMEM_TABLE_BYTES` (one kernel call a group).
The GPU kernel reads K and V in the cache's dtype and splits each row's pages into `k_splits`
partitions attended in parallel and merged (flash-decoding); it applies no softmax scale either,
and a row of length 0 gets zeros. Its grid covers heads in blocks of 16 (`block_h`), padding a
smaller group of query heads per kv head.
On a CPU both run in Pallas interpret mode (`interpret=True`: slow, for tests).
"""
from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp

# Pages per compute block: the kernel's inner loop visits this many pages at a time.
BLOCK_CHOICES = (8, 4, 2, 1)
# The page-table bytes one kernel call may prefetch into SMEM: most of its 1 MiB, leaving room
# for the lengths and the kernel's own scalars.
SMEM_TABLE_BYTES = 768 * 1024


def rows_per_call(rows: int, pages_per_row: int, table_bytes: int = SMEM_TABLE_BYTES) -> int:
    """Rows whose int32 page tables fit `table_bytes` (at least 1, at most `rows`)."""
    return max(1, min(rows, table_bytes // (4 * pages_per_row)))


def pages_per_compute_block(pages_per_row: int, page_size: int) -> int:
    """The largest choice that divides the table width, preferring >= 512 tokens a block (a
    v5e/v5p core's MXU tile at head_dim 128) and never more than the row's pages."""
    fitting = [b for b in BLOCK_CHOICES if pages_per_row % b == 0]
    enough = [b for b in fitting if b * page_size >= 512]
    return min(enough) if enough else fitting[0]


def tpu_paged_decode_attention(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array,
                               page_table: jax.Array, lengths: jax.Array,
                               interpret: bool = False,
                               table_bytes: int = SMEM_TABLE_BYTES) -> jax.Array:
    """q [B, H, D] (one new token per row, already written to its pages); k/v_pages
    [kv_heads, num_pages, page_size, D]; page_table [B, pages_per_row] (unmapped entries may hold
    any value: they are clamped in range and lie past the row's length); lengths [B] tokens to
    attend. Returns [B, H, D] in q's dtype. One kernel call per group of `rows_per_call` rows."""
    from jax.experimental.pallas import tpu as pltpu
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

    head_dim = q.shape[-1]
    num_pages, page_size = k_pages.shape[1], k_pages.shape[2]
    table = jnp.minimum(page_table, num_pages - 1)
    block = pages_per_compute_block(table.shape[1], page_size)
    scaled = (q.astype(jnp.float32) * head_dim ** -0.5).astype(q.dtype)
    lengths = jnp.maximum(lengths, 1).astype(jnp.int32)
    group = rows_per_call(q.shape[0], table.shape[1], table_bytes)
    context = pltpu.force_tpu_interpret_mode() if interpret else contextlib.nullcontext()
    with context:
        out = [paged_attention(scaled[r:r + group], k_pages, v_pages, lengths[r:r + group],
                               table[r:r + group], pages_per_compute_block=block)
               for r in range(0, q.shape[0], group)]
    return jnp.concatenate(out, axis=0).astype(q.dtype)


def _largest_divisor(total: int, choices: tuple[int, ...]) -> int:
    return next(c for c in choices if total % c == 0)


def gpu_paged_decode_attention(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array,
                               page_table: jax.Array, lengths: jax.Array,
                               interpret: bool = False) -> jax.Array:
    """tpu_paged_decode_attention's contract on a GPU: q [B, H, D], k/v_pages [kv_heads,
    num_pages, page_size, D], page_table [B, pages_per_row], lengths [B] -> [B, H, D]. Each row's
    pages split into up to 16 partitions (dividing the table) of up to 8-page compute blocks."""
    from jax.experimental.pallas.ops.gpu.paged_attention import paged_attention

    head_dim = q.shape[-1]
    num_pages, per_row = k_pages.shape[1], page_table.shape[1]
    splits = _largest_divisor(per_row, (16, 8, 4, 2, 1))
    block = _largest_divisor(per_row // splits, BLOCK_CHOICES)
    scaled = (q.astype(jnp.float32) * head_dim ** -0.5).astype(q.dtype)
    out = paged_attention(scaled, k_pages, v_pages, jnp.minimum(page_table, num_pages - 1),
                          lengths.astype(jnp.int32), k_splits=splits,
                          pages_per_compute_block=block, interpret=interpret)
    return out.astype(q.dtype)
