"""A paged KV cache: every layer's keys and values live in one pool of fixed-size pages, and each
row (a decode slot) holds a table of the pages it has filled. The cache's memory then follows the
tokens in flight rather than rows x max context, and rows that share a prompt share its pages.

Layout (the TPU paged-attention kernel's, see paged_attention.py), per layer:
  k, v        [kv_heads, num_pages, page_size, head_dim]
  page_table  [rows, pages_per_row] int32: entry j is the page holding the row's tokens
              [j * page_size, (j + 1) * page_size); `no_page` (= num_pages, a shard's pages
              when split) where none is mapped.
  lengths     [rows] int32: tokens written per row (the next write position).

Pages are reference-counted so that a prompt's full pages can sit in several tables at once
(`share_pages`); a page returns to the free stack when the last table holding it lets it go
(`release`). Everything runs inside jit: the free pages are a stack (`free[:num_free]`), a write
that crosses into a new page pops one (`reserve`, once per step for all layers), a release pushes
the pages whose count drops to zero. Running out of pages is never silent: `reserve` then maps
nothing for that step, sets `overflow` (sticky; the caller checks it on the host) and the writes
past a row's mapped pages are dropped, so no other row's page is overwritten.

On a mesh that splits the rows over its batch axes, the cache is one such pool per batch shard
(`init_paged_cache(shards=S)`; paged_sharding.py): page ids are local to a shard's pool, and
every function here runs per shard. Its counters `num_free` and `overflow` are then [S].
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from matpo_jax.model import paged_sharding
from matpo_jax.model.cached_attention import MASKED_SCORE


class PagedKVCache(NamedTuple):
    k: tuple  # per layer: [kv_heads, num_pages, page_size, head_dim]
    v: tuple  # per layer: [kv_heads, num_pages, page_size, head_dim]
    page_table: jax.Array  # [rows, pages_per_row] int32; no_page = no page
    lengths: jax.Array  # [rows] int32
    refcount: jax.Array  # [num_pages] int32: tables holding each page
    free: jax.Array  # [num_pages] int32: free[:num_free] are the free pages (a stack)
    num_free: jax.Array  # () int32 ([S]: one stack per shard's slice of `free`)
    overflow: jax.Array  # () bool: some reserve found too few free pages (sticky) ([S])

    @property
    def num_pages(self) -> int:
        """Pages in the pool (all shards' pools together)."""
        return self.v[0].shape[1]

    @property
    def shards(self) -> int:
        """Pools the cache is split into (paged_sharding.py); 1: one pool."""
        return 1 if self.num_free.ndim == 0 else self.num_free.shape[0]

    @property
    def no_page(self) -> int:
        """The table entry of an unmapped page: one past a shard's last page id."""
        return self.num_pages // self.shards

    @property
    def page_size(self) -> int:
        return self.v[0].shape[2]

    @property
    def pages_per_row(self) -> int:
        return self.page_table.shape[1]

    @property
    def max_len(self) -> int:
        return self.pages_per_row * self.page_size

    def rows(self, index) -> "PagedKVCache":
        """The sub-cache of rows `index` (int [L]): their tables and lengths over the same pool
        (no page is copied). Write through it, then `set_rows` it back."""
        return self._replace(page_table=self.page_table[index], lengths=self.lengths[index])

    def set_rows(self, index, sub: "PagedKVCache") -> "PagedKVCache":
        """Takes back a sub-cache from `rows(index)`: the pool and the free pages as the sub-cache
        left them, its tables and lengths into rows `index` (out-of-range indices dropped)."""
        return sub._replace(page_table=self.page_table.at[index].set(sub.page_table, mode="drop"),
                            lengths=self.lengths.at[index].set(sub.lengths, mode="drop"))


class PagedView(NamedTuple):
    """What one extend's attention needs of a paged cache besides a layer's pages."""
    page_table: jax.Array  # [B, pages_per_row], pages already reserved for the new tokens
    positions: jax.Array  # [B, T] each new token's position
    lengths: jax.Array  # [B] tokens per row after the write
    num_valid: jax.Array  # [B] new tokens per row (the rest of T is padding)


def init_paged_cache(num_layers: int, kv_heads: int, head_dim: int, rows: int, max_len: int,
                     num_pages: int, page_size: int, dtype=jnp.float32,
                     shards: int = 1) -> PagedKVCache:
    """An empty cache of `num_pages` pages; each row may grow to max_len (a multiple of
    page_size) tokens. Sizing num_pages below rows * max_len / page_size is the point: the pool
    holds the tokens expected in flight, not every row at its longest. shards > 1: a pool of
    num_pages / shards pages per batch shard, each serving rows / shards rows (paged_sharding)."""
    if max_len % page_size:
        raise ValueError(f"max_len {max_len} is not a multiple of page_size {page_size}")
    if shards > 1 and (rows % shards or num_pages % shards):
        raise ValueError(f"a paged cache split over {shards} batch shards needs rows ({rows}) "
                         f"and pages ({num_pages}) that are multiples of {shards}")
    per_shard = num_pages // shards
    shape = (kv_heads, num_pages, page_size, head_dim)
    # Popped from the top: page 0 (of each shard's pool) first.
    stack = jnp.arange(per_shard - 1, -1, -1, dtype=jnp.int32)
    counters = () if shards == 1 else (shards,)
    return PagedKVCache(
        k=tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
        v=tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
        page_table=jnp.full((rows, max_len // page_size), per_shard, jnp.int32),
        lengths=jnp.zeros((rows,), jnp.int32),
        refcount=jnp.zeros((num_pages,), jnp.int32),
        free=jnp.tile(stack, shards),
        num_free=jnp.full(counters, per_shard, jnp.int32),
        overflow=jnp.zeros(counters, bool))


def empty_rows(cache: PagedKVCache, rows: int) -> PagedKVCache:
    """The cache's pool with `rows` new empty rows instead of its own (tables kept aside, such
    as a prompt store's; rows / shards of them per shard)."""
    return cache._replace(
        page_table=jnp.full((rows, cache.pages_per_row), cache.no_page, jnp.int32),
        lengths=jnp.zeros((rows,), jnp.int32))


def _pages_for(tokens: jax.Array, page_size: int) -> jax.Array:
    return (tokens + page_size - 1) // page_size


def pages_in_use(cache: PagedKVCache) -> jax.Array:
    """Pages held by some table (all shards)."""
    return cache.num_pages - jnp.sum(cache.num_free)


def reserve(cache: PagedKVCache, new_lengths: jax.Array) -> PagedKVCache:
    """Maps pages so that every row b can hold new_lengths[b] tokens (rows already covering it
    are left alone). All or nothing (per shard): if the free pages do not suffice, nothing is
    mapped and `overflow` is set. Does not change `lengths` (the writes that follow do, via
    `advance`)."""
    if cache.shards != paged_sharding.current_shards():
        raise ValueError(f"this paged KV cache has {cache.shards} pool(s) and the kernel mesh "
                         f"splits the batch {paged_sharding.current_shards()} ways; "
                         "init_paged_cache(shards=...) must match the mesh")
    return paged_sharding.on_shards(_reserve, cache, new_lengths)


def _reserve(cache: PagedKVCache, new_lengths: jax.Array) -> PagedKVCache:
    rows, per_row = cache.page_table.shape
    have = _pages_for(cache.lengths, cache.page_size)
    want = jnp.minimum(_pages_for(new_lengths, cache.page_size), per_row)
    j = jnp.arange(per_row, dtype=jnp.int32)[None, :]
    need = ((j >= have[:, None]) & (j < want[:, None])).reshape(-1)
    rank = jnp.cumsum(need, dtype=jnp.int32) - 1
    total = jnp.sum(need, dtype=jnp.int32)
    fits = total <= cache.num_free
    take = cache.free[jnp.clip(cache.num_free - 1 - rank, 0, cache.num_pages - 1)]
    mapped = need & fits
    table = jnp.where(mapped, take, cache.page_table.reshape(-1)).reshape(rows, per_row)
    refcount = cache.refcount.at[jnp.where(mapped, take, cache.num_pages)].add(1, mode="drop")
    too_long = jnp.any(new_lengths > cache.max_len)
    return cache._replace(page_table=table, refcount=refcount,
                          num_free=cache.num_free - jnp.where(fits, total, 0),
                          overflow=cache.overflow | ~fits | too_long)


def advance(cache: PagedKVCache, new_lengths: jax.Array) -> PagedKVCache:
    """Records the writes of a step: lengths become new_lengths, capped at the mapped pages (a
    row whose reserve overflowed keeps only what it could write)."""
    return paged_sharding.on_shards(_advance, cache, new_lengths)


def _advance(cache: PagedKVCache, new_lengths: jax.Array) -> PagedKVCache:
    mapped = jnp.sum(cache.page_table < cache.num_pages, axis=1, dtype=jnp.int32)
    return cache._replace(lengths=jnp.minimum(new_lengths, mapped * cache.page_size))


def write(k_pages: jax.Array, v_pages: jax.Array, page_table: jax.Array, positions: jax.Array,
          k_new: jax.Array, v_new: jax.Array, num_valid: jax.Array | None = None
          ) -> tuple[jax.Array, jax.Array]:
    """One layer's new keys and values into their pages. positions [B, T]: each token's position
    in its row; k_new, v_new [B, T, kv_heads, head_dim]; num_valid [B]: tokens t >= num_valid[b]
    are padding and not written. Tokens whose page is not mapped are dropped."""
    if num_valid is None:
        num_valid = jnp.full(positions.shape[:1], positions.shape[1], jnp.int32)
    return paged_sharding.write_on_shards(_write, k_pages, v_pages, page_table, positions, k_new,
                                          v_new, num_valid)


def _write(k_pages, v_pages, page_table, positions, k_new, v_new, num_valid):
    num_pages, page_size = k_pages.shape[1], k_pages.shape[2]
    per_row = page_table.shape[1]
    slot = jnp.clip(positions // page_size, 0, per_row - 1)
    page = jnp.take_along_axis(page_table, slot, axis=1)
    page = jnp.where(positions < per_row * page_size, page, num_pages)
    t = jnp.arange(positions.shape[1], dtype=jnp.int32)[None, :]
    page = jnp.where(t < num_valid[:, None], page, num_pages)
    offset = positions % page_size
    # Advanced indices on axes 1 and 2 -> the update is [kv_heads, B, T, head_dim].
    k_pages = k_pages.at[:, page, offset].set(jnp.moveaxis(k_new, 2, 0).astype(k_pages.dtype),
                                              mode="drop")
    v_pages = v_pages.at[:, page, offset].set(jnp.moveaxis(v_new, 2, 0).astype(v_pages.dtype),
                                              mode="drop")
    return k_pages, v_pages


def release(cache: PagedKVCache, rows: jax.Array) -> PagedKVCache:
    """Empties the rows where rows[b] (bool [B]): their tables let go of their pages, and every
    page no table holds any more goes back on the free stack."""
    return paged_sharding.on_shards(_release, cache, rows)


def _release(cache: PagedKVCache, rows: jax.Array) -> PagedKVCache:
    held = (cache.page_table < cache.num_pages) & rows[:, None]
    dropped = jnp.zeros_like(cache.refcount).at[
        jnp.where(held, cache.page_table, cache.num_pages).reshape(-1)].add(1, mode="drop")
    refcount = cache.refcount - dropped
    freed = (dropped > 0) & (refcount == 0)
    rank = jnp.cumsum(freed, dtype=jnp.int32) - 1
    pages = jnp.arange(cache.num_pages, dtype=jnp.int32)
    free = cache.free.at[jnp.where(freed, cache.num_free + rank, cache.num_pages)].set(
        pages, mode="drop")
    return cache._replace(
        page_table=jnp.where(rows[:, None], cache.num_pages, cache.page_table),
        lengths=jnp.where(rows, 0, cache.lengths), refcount=refcount, free=free,
        num_free=cache.num_free + jnp.sum(freed, dtype=jnp.int32))


def share_pages(cache: PagedKVCache, src_table: jax.Array, dst: jax.Array, num_tokens: jax.Array
                ) -> PagedKVCache:
    """Restarts each row dst[i] (int [M]; out of range = skip that entry) with the first
    num_tokens[i] tokens held by the pages src_table[i] ([M, pages_per_row]: another row's
    table, or a table kept aside such as a prompt store's): the full pages by reference (the
    same page ids, counted once more), the partial last page copied into a fresh page (the dst
    row writes its next tokens there, so a shared page is never written through). A dst row is
    released first. One pool only (a sharded cache: `share_rows`)."""
    if cache.shards > 1:
        raise ValueError("share_pages takes row indices of a one-pool cache; a cache with a pool "
                         "per batch shard shares through share_rows")
    return _share_pages(cache, src_table, dst, num_tokens)


def share_rows(cache: PagedKVCache, src_table: jax.Array, num_tokens: jax.Array,
               starting: jax.Array) -> PagedKVCache:
    """`share_pages` row by row: every row b with starting[b] restarts from the first
    num_tokens[b] tokens of the pages src_table[b] (which must be in row b's shard's pool: a
    table kept per shard, such as the slot loop's prompt store). Runs per shard."""

    def local(cache, src_table, num_tokens, starting):
        rows = cache.lengths.shape[0]
        dst = jnp.where(starting, jnp.arange(rows, dtype=jnp.int32), rows)
        return _share_pages(cache, src_table, dst, num_tokens)
    return paged_sharding.on_shards(local, cache, src_table, num_tokens, starting)


def _share_pages(cache: PagedKVCache, src_table: jax.Array, dst: jax.Array,
                 num_tokens: jax.Array) -> PagedKVCache:
    rows = cache.lengths.shape[0]
    valid = dst < rows
    cache = _release(cache, jnp.zeros((rows,), bool).at[dst].set(True, mode="drop"))
    page_size = cache.page_size
    full = num_tokens // page_size
    j = jnp.arange(cache.pages_per_row, dtype=jnp.int32)[None, :]
    shared = (j < full[:, None]) & valid[:, None]
    table = cache.page_table.at[dst].set(jnp.where(shared, src_table, cache.num_pages),
                                         mode="drop")
    refcount = cache.refcount.at[jnp.where(shared, src_table, cache.num_pages).reshape(-1)].add(
        1, mode="drop")
    cache = cache._replace(page_table=table, refcount=refcount,
                           lengths=cache.lengths.at[dst].set(full * page_size, mode="drop"))
    # The partial page: a fresh page for dst, the src's tokens copied into it in every layer.
    target_lengths = cache.lengths.at[dst].set(num_tokens, mode="drop")
    cache = _reserve(cache, target_lengths)
    partial = valid & (num_tokens % page_size > 0)
    last = jnp.minimum(full, cache.pages_per_row - 1)
    from_page = jnp.where(partial, src_table[jnp.arange(dst.shape[0]), last], cache.num_pages)
    to_page = jnp.where(partial, cache.page_table[jnp.minimum(dst, rows - 1), last],
                        cache.num_pages)
    source = jnp.minimum(from_page, cache.num_pages - 1)
    k = tuple(k.at[:, to_page].set(k[:, source], mode="drop") for k in cache.k)
    v = tuple(v.at[:, to_page].set(v[:, source], mode="drop") for v in cache.v)
    return _advance(cache._replace(k=k, v=v), target_lengths)


def paged_attention_reference(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array,
                              page_table: jax.Array, lengths: jax.Array, positions: jax.Array
                              ) -> jax.Array:
    """Attention of new queries over their rows' pages, gathered into dense rows (the XLA path:
    it reads every mapped and unmapped entry of each table, as the dense cache reads every slot).

    q [B, T, H, D]; positions [B, T] each query's position; query (b, t) attends position s iff
    s <= positions[b, t] and s < lengths[b] (the dense cache's `extend` mask). Returns
    [B, T, H * D]. Runs per shard under a kernel mesh that splits the batch."""
    return paged_sharding.attend_on_shards(_attention_reference, q, k_pages, v_pages, page_table,
                                           lengths, positions)


def _attention_reference(q, k_pages, v_pages, page_table, lengths, positions):
    batch, q_len, heads, head_dim = q.shape
    kv_heads, num_pages = k_pages.shape[0], k_pages.shape[1]
    table = jnp.minimum(page_table, num_pages - 1)  # unmapped entries: any page, masked below
    keys = k_pages[:, table].reshape(kv_heads, batch, -1, head_dim)  # [K, B, S, D]
    values = v_pages[:, table].reshape(kv_heads, batch, -1, head_dim)
    slots = jnp.arange(keys.shape[2], dtype=jnp.int32)
    mask = (slots[None, None, :] <= positions[:, :, None]) & (
        slots[None, None, :] < lengths[:, None, None])
    qg = q.reshape(batch, q_len, kv_heads, heads // kv_heads, head_dim)
    scores = jnp.einsum("btkgd,kbsd->bkgts", qg, keys, preferred_element_type=jnp.float32)
    scores = jnp.where(mask[:, None, None], scores * head_dim ** -0.5, MASKED_SCORE)
    probs = jax.nn.softmax(scores, axis=-1).astype(values.dtype)
    out = jnp.einsum("bkgts,kbsd->btkgd", probs, values)
    return out.reshape(batch, q_len, heads * head_dim)
