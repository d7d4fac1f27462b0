"""A Pallas TPU kernel for multi-token extends over a paged KV cache (prompts, tool responses,
re-prefilled contexts written into the pages by `paged_cache.write`): each row's new queries attend
the pages its length covers, one page at a time with an online softmax, so an extend reads the
pages a row has filled instead of gathering every entry of its page table into a dense row (what
the XLA reference, `paged_cache.paged_attention_reference`, does).

JAX's own `...tpu.ragged_paged_attention` takes extends too, but over another pool layout (K and
V interleaved per page) and it does not run in this jax's TPU interpret mode, so it could not be
checked here; this kernel reads the cache's own layout and runs in interpret mode on a CPU.

Grid (row, kv head, page): the page axis is the inner, sequential one. A page's block index comes
from the page table (scalar-prefetched into SMEM); pages past a row's last filled page map to that
last page again, which the pipeline does not fetch twice, and their step computes nothing. The
queries of one kv head are its group of G query heads x T new tokens, laid out as G*T rows (row
r = g * T + t), each masked by the extend's rule: key position s is attended iff s <= the
query's position (the row's first new position + t) and s < the row's length after the write.
Scores, softmax and the output accumulate in float32; the softmax scale is applied to the queries
by the wrapper.
"""
from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp

MASKED_SCORE = -1e30


def _kernel(table_ref, starts_ref, lengths_ref, q_ref, offsets_ref, k_ref, v_ref, out_ref,
            m_ref, l_ref, acc_ref, *, page_size: int, num_page_steps: int):
    from jax.experimental import pallas as pl
    row, page = pl.program_id(0), pl.program_id(2)

    @pl.when(page == 0)
    def _init():
        m_ref[...] = jnp.full(m_ref.shape, MASKED_SCORE, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    length = lengths_ref[row]

    @pl.when(page * page_size < length)
    def _attend():
        q = q_ref[...]
        scores = jax.lax.dot_general(q, k_ref[...], (((1,), (1,)), ((), ())),
                                     preferred_element_type=jnp.float32)  # [G*T, page]
        keys = page * page_size + jax.lax.broadcasted_iota(jnp.int32, scores.shape, 1)
        positions = starts_ref[row] + offsets_ref[...]  # [G*T, 1]
        scores = jnp.where((keys <= positions) & (keys < length), scores, MASKED_SCORE)
        m_prev = m_ref[...][:, :1]
        m_new = jnp.maximum(m_prev, jnp.max(scores, axis=1, keepdims=True))
        weights = jnp.exp(scores - m_new)
        alpha = jnp.exp(m_prev - m_new)
        l_new = alpha * l_ref[...][:, :1] + jnp.sum(weights, axis=1, keepdims=True)
        acc_ref[...] = alpha * acc_ref[...] + jax.lax.dot_general(
            weights.astype(v_ref.dtype), v_ref[...], (((1,), (0,)), ((), ())),
            preferred_element_type=jnp.float32)
        m_ref[...] = jnp.broadcast_to(m_new, m_ref.shape)
        l_ref[...] = jnp.broadcast_to(l_new, l_ref.shape)

    @pl.when(page == num_page_steps - 1)
    def _finish():
        # A row with nothing to attend (an empty lane, length 0) gets zeros, not 0 / 0.
        norm = jnp.maximum(l_ref[...][:, :1], 1e-30)
        out_ref[...] = (acc_ref[...] / norm).astype(out_ref.dtype)


def tpu_paged_extend_attention(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array,
                               page_table: jax.Array, lengths: jax.Array, positions: jax.Array,
                               interpret: bool = False) -> jax.Array:
    """q [B, T, H, D] (the new tokens' queries, already written to their pages); k/v_pages
    [kv_heads, num_pages, page_size, D]; page_table [B, pages_per_row] (unmapped entries may hold
    any value past the row's length); lengths [B] tokens per row after the write; positions
    [B, T] = the row's first new position + t (an extend's contiguous positions). Returns
    [B, T, H * D] in q's dtype: `paged_attention_reference`'s contract."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    batch, q_len, heads, head_dim = q.shape
    kv_heads, num_pages, page_size, _ = k_pages.shape
    group = heads // kv_heads
    rows = group * q_len
    pages_per_row = page_table.shape[1]
    # [B, T, K, G, D] -> [B, K, G * T, D]: one kv head's queries as one block (row g * T + t).
    scaled = (q.astype(jnp.float32) * head_dim ** -0.5).astype(k_pages.dtype)
    grouped = scaled.reshape(batch, q_len, kv_heads, group, head_dim).transpose(0, 2, 3, 1, 4)
    grouped = grouped.reshape(batch, kv_heads, rows, head_dim)
    offsets = jnp.tile(jnp.arange(q_len, dtype=jnp.int32), group)[:, None]  # [G * T, 1]
    table = jnp.clip(page_table, 0, num_pages - 1).astype(jnp.int32)
    lengths = lengths.astype(jnp.int32)
    starts = positions[:, 0].astype(jnp.int32)

    def page_index(row, head, page, table, starts, lengths):
        # lax.div (truncating; the operands are >= 0): `//` lowers through `sign`, which Mosaic
        # resolves for the host's device kind when compiling for a TPU from a CPU.
        last = jax.lax.div(jnp.maximum(lengths[row] - 1, 0), jnp.int32(page_size))
        return head, table[row, jnp.minimum(page, last)], 0, 0

    query_spec = pl.BlockSpec((None, None, rows, head_dim),
                              lambda row, head, page, *_: (row, head, 0, 0))
    page_spec = pl.BlockSpec((None, None, page_size, head_dim), page_index)
    context = pltpu.force_tpu_interpret_mode() if interpret else contextlib.nullcontext()
    with context:  # read when the call is built
        call = pl.pallas_call(
            functools.partial(_kernel, page_size=page_size, num_page_steps=pages_per_row),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=3,
                grid=(batch, kv_heads, pages_per_row),
                in_specs=[query_spec, pl.BlockSpec((rows, 1), lambda *_: (0, 0)), page_spec,
                          page_spec],
                out_specs=query_spec,
                scratch_shapes=[pltpu.VMEM((rows, 128), jnp.float32),
                                pltpu.VMEM((rows, 128), jnp.float32),
                                pltpu.VMEM((rows, head_dim), jnp.float32)]),
            compiler_params=pltpu.CompilerParams(
                dimension_semantics=("parallel", "parallel", "arbitrary")),
            out_shape=jax.ShapeDtypeStruct((batch, kv_heads, rows, head_dim), q.dtype),
            name="paged_extend_attention")
        out = call(table, starts, lengths, grouped, offsets, k_pages, v_pages)
    out = out.reshape(batch, kv_heads, group, q_len, head_dim).transpose(0, 3, 1, 2, 4)
    return out.reshape(batch, q_len, heads * head_dim).astype(q.dtype)
