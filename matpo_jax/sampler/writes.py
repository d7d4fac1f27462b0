"""How the slot loop writes into its KV cache: injected tokens and shared-prefix copies.

An injection appends host-chosen tokens to some slots (prompts, tool responses, re-prefilled
contexts) by `model.extend_last` of a static width. A prefix copy starts a reset slot from the
cached keys and values of a prompt prefix that many sequences share (a role's system prompt, the
question the G samples of a group answer), computed once per loop instead of once per sequence.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from matpo_jax.model import paged_cache
from matpo_jax.model.decoder import KVCache, init_cache


def inject(model, cache: KVCache, logits, read_tokens, num, buckets, lanes: int, max_num: int,
           roles=None):
    """Appends the first num[b] tokens of row b to every row with num[b] > 0 and sets its
    next-token logits (the extend's at index num-1); other rows keep theirs, and nothing runs
    when num is all 0. roles [B]: each row's role id (its LoRA adapter; None: role 0).

    read_tokens(rows, start, width) -> int32[len(rows), width]: columns [start, start + width)
    of the given rows' tokens (row index B = an empty lane: any tokens). It is called once per
    extend with the extend's static width, so a reader that fetches from the host moves exactly
    the positions the extend computes (see `loop.py`, the host protocol). max_num: a static bound
    on num (whether a chunked extend has to be compiled).

    With lanes >= B, all rows are extended together at the smallest width of `buckets` that fits
    max(num). With lanes < B, the rows that receive tokens are gathered `lanes` at a time into a
    sub-cache (a static [lanes, ...] shape), extended at the smallest width that fits that
    group's longest write, and scattered back, looping while rows remain: a host call writing a
    long page into one slot and a short tool error into another pays one long and one short
    extend, not two long ones, and no slot that receives nothing costs anything. Only each row's
    last written position is projected to the vocabulary (`model.extend_last`).
    """
    slots = num.shape[0]
    roles = jnp.zeros((slots,), jnp.int32) if roles is None else roles
    shards = getattr(cache, "shards", 1)
    lanes = -(-lanes // shards) * shards  # a paged cache per batch shard: lanes per shard
    if lanes >= slots:
        return bucketed_extend(model, cache, logits, read_tokens, jnp.arange(slots), num, buckets,
                               max_num, roles)

    def extend_lanes(carry):
        cache, logits, pending = carry
        rows, gather = pick_lanes(pending, lanes, shards)
        lane_num = jnp.where(rows < slots, num[gather], 0)
        sub, new = bucketed_extend(model, cache.rows(gather), logits[gather], read_tokens, rows,
                                   lane_num, buckets, max_num, roles[gather])
        # Empty lanes scatter to row `slots`, which mode="drop" discards.
        return (cache.set_rows(rows, sub), logits.at[rows].set(new, mode="drop"),
                pending.at[rows].set(False, mode="drop"))

    cache, logits, _ = jax.lax.while_loop(lambda carry: jnp.any(carry[2]), extend_lanes,
                                          (cache, logits, num > 0))
    return cache, logits


def pick_lanes(pending, lanes: int, shards: int = 1):
    """(rows, gather) of the next extend: rows [lanes] the first pending rows (slots = an empty
    lane, dropped on the way back), gather [lanes] the rows to read (an empty lane reads a row of
    its own shard). shards > 1: lanes / shards rows from each shard's block of rows, in shard
    order, so the lanes' sub-cache has each shard's rows on that shard (paged_sharding.py)."""
    slots = pending.shape[0]
    if shards == 1:
        rows = jnp.nonzero(pending, size=lanes, fill_value=slots)[0]
        return rows, jnp.minimum(rows, slots - 1)
    per_shard, block = lanes // shards, slots // shards
    local = jax.vmap(lambda p: jnp.nonzero(p, size=per_shard, fill_value=block)[0])(
        pending.reshape(shards, block))
    base = (jnp.arange(shards, dtype=local.dtype) * block)[:, None]
    rows = jnp.where(local < block, base + local, slots).reshape(-1)
    return rows, (base + jnp.minimum(local, block - 1)).reshape(-1)


def array_reader(tokens):
    """A `read_tokens` over a device array tokens [B, W] (columns past W read as 0)."""

    def read(rows, start, width):
        picked = tokens[jnp.minimum(rows, tokens.shape[0] - 1)]
        picked = jnp.pad(picked, ((0, 0), (0, width)))  # every slice in bounds
        return jax.lax.dynamic_slice_in_dim(picked, start, width, axis=1)
    return read


def bucketed_extend(model, cache: KVCache, logits, read_tokens, rows, num, buckets,
                    max_num: int, roles=None):
    """Extends every row of `cache` (the token rows `rows` of `read_tokens`) by the smallest
    static width in `buckets` that fits max(num); when max_num exceeds the last bucket, longer
    writes go through a loop of extends of the last width (`extend_in_chunks`).

    The width is picked by one `lax.cond` per bucket (at most one is taken) rather than a
    `lax.switch`: XLA updates the cache in place through a conditional whose other branch is the
    identity, but copies the whole cache in and out of a switch whose several branches write it.
    """

    def extend_once(width):
        return lambda cache, logits: _extend(model, cache, logits,
                                             read_tokens(rows, jnp.int32(0), width), num, roles)

    branches = [extend_once(width) for width in buckets]
    if buckets[-1] < max_num:
        branches.append(lambda cache, logits: extend_in_chunks(
            model, cache, logits, read_tokens, rows, num, buckets[-1], roles))
    longest = jnp.max(num)
    chosen = jnp.where(longest == 0, -1, jnp.sum(jnp.asarray(buckets) < longest))
    for index, branch in enumerate(branches):
        cache, logits = jax.lax.cond(chosen == index, branch, lambda c, l: (c, l), cache, logits)
    return cache, logits


def extend_width(length: int, buckets) -> int:
    """Positions per row that `bucketed_extend` computes for a longest write of `length`: the
    smallest bucket that fits it, past the last bucket whole chunks of the last."""
    buckets = sorted(buckets)
    return next((b for b in buckets if b >= length), -(-length // buckets[-1]) * buckets[-1])


def _extend(model, cache: KVCache, logits, tokens, num, roles=None):
    new, cache = model.extend_last(tokens, num, cache, roles)
    return cache, jnp.where((num > 0)[:, None], new, logits)


def extend_in_chunks(model, cache: KVCache, logits, read_tokens, rows, num, chunk: int,
                     roles=None):
    """Writes a long injection as a loop of `chunk`-wide extends: the extend activations stay
    chunk-sized whatever the context length, and only one more extend width is compiled."""

    def write_chunk(carry):
        start, cache, logits = carry
        part = read_tokens(rows, start, chunk)
        cache, logits = _extend(model, cache, logits, part, jnp.clip(num - start, 0, chunk),
                                roles)
        return start + chunk, cache, logits

    _, cache, logits = jax.lax.while_loop(lambda carry: carry[0] < jnp.max(num), write_chunk,
                                          (jnp.int32(0), cache, logits))
    return cache, logits


# ----------------------------------------------------------------------------- shared prefixes


class PrefixStore(NamedTuple):
    """Keys and values of P token prefixes, and the next-token logits after each."""

    cache: KVCache  # P rows of max_len = the padded prefix width
    logits: jax.Array  # float32[P, V]


def prefix_store_shape(prefix_lengths, buckets, max_len: int) -> tuple[int, int]:
    """(rows, width) of the store holding prefixes of these lengths: rows padded to a power of two
    (padding rows cost no compute) and width the extend width of the longest (at most max_len),
    so batches whose prompts differ a little share one compilation. (0, 0) without prefixes."""
    if not prefix_lengths:
        return 0, 0
    width = min(extend_width(max(prefix_lengths), buckets), max_len)
    return 1 << (len(prefix_lengths) - 1).bit_length(), width


def prefix_store_buckets(buckets, width: int) -> tuple[int, ...]:
    """The extend widths the store is built with: the injection buckets below its width, then
    its width (so no prefix is written in chunks)."""
    return tuple(b for b in sorted(buckets) if b < width) + (width,)


def build_prefix_store(model, tokens, lengths, buckets, roles=None) -> PrefixStore:
    """Computes the store from tokens [P, W] (row p's prefix is tokens[p, :lengths[p]]), one row
    at a time, by the same bucketed extends as an injection. roles [P]: the role id of the
    sequences each prefix starts (its LoRA adapter; None: role 0)."""
    rows, width = tokens.shape
    cache = init_cache(model.config, rows, width)
    logits = jnp.zeros((rows, model.config.vocab_size), jnp.float32)
    cache, logits = inject(model, cache, logits, array_reader(tokens), lengths,
                           prefix_store_buckets(buckets, width), lanes=1, max_num=width,
                           roles=roles)
    return PrefixStore(cache, logits)


def copy_prefixes(cache: KVCache, logits, store: PrefixStore, prefix):
    """Starts every slot b with prefix[b] >= 0 from store row prefix[b]: its keys and values
    (positions past the prefix's length are masked by the slot's length and overwritten by later
    writes), its length and its next-token logits. One in-place row update per started slot."""

    def copy_one(carry):
        cache, logits, pending = carry
        slot = jnp.argmax(pending)
        row = prefix[slot]
        keys = tuple(jax.lax.dynamic_update_slice(k, s[row][None], (slot, 0, 0, 0))
                     for k, s in zip(cache.k, store.cache.k))
        values = tuple(jax.lax.dynamic_update_slice(v, s[row][None], (slot, 0, 0, 0))
                       for v, s in zip(cache.v, store.cache.v))
        lengths = cache.lengths.at[slot].set(store.cache.lengths[row])
        return (KVCache(keys, values, lengths), logits.at[slot].set(store.logits[row]),
                pending.at[slot].set(False))

    cache, logits, _ = jax.lax.while_loop(lambda carry: jnp.any(carry[2]), copy_one,
                                          (cache, logits, prefix >= 0))
    return cache, logits


# ----------------------------------------------------------------------------- shared prefixes, paged


class PagedPrefixStore(NamedTuple):
    """P token prefixes held in the loop's own page pool: their page tables (pinned: no slot's
    release frees them), lengths and the next-token logits after each. A cache with a pool per
    batch shard holds S copies: rows s * P + p are prefix p in shard s's pool."""

    page_table: jax.Array  # int32[P, pages_per_row]
    lengths: jax.Array  # int32[P]
    logits: jax.Array  # float32[P, V]


def build_paged_prefix_store(model, cache: paged_cache.PagedKVCache, tokens, lengths, buckets,
                             roles=None):
    """(cache, store): the prefixes tokens [P, W] written into pages of `cache`'s pool by the same
    bucketed extends as `build_prefix_store`, their tables kept aside in the store."""
    rows, width = tokens.shape
    # A cache with a pool per batch shard keeps a copy of the store in every shard's pool (rows
    # s * P + p), computed side by side: one extend writes the same prefix on every shard.
    shards = cache.shards
    roles = jnp.zeros((rows,), jnp.int32) if roles is None else roles
    aside = paged_cache.empty_rows(cache, shards * rows)
    logits = jnp.zeros((shards * rows, model.config.vocab_size), jnp.float32)
    aside, logits = inject(model, aside, logits, array_reader(jnp.tile(tokens, (shards, 1))),
                           jnp.tile(lengths, shards), prefix_store_buckets(buckets, width),
                           lanes=shards, max_num=width, roles=jnp.tile(roles, shards))
    store = PagedPrefixStore(aside.page_table, aside.lengths, logits)
    return aside._replace(page_table=cache.page_table, lengths=cache.lengths), store


def share_prefixes(cache: paged_cache.PagedKVCache, logits, store: PagedPrefixStore, prefix):
    """`copy_prefixes` over pages: every slot b with prefix[b] >= 0 takes store row prefix[b]'s
    full pages by reference and a copy of its partial last page (`paged_cache.share_pages`), its
    length and its next-token logits; all slots at once."""
    slots = prefix.shape[0]
    starting = prefix >= 0
    # Slot b takes its shard's copy of the store (rows s * P + p).
    per_shard = store.lengths.shape[0] // cache.shards
    shard = jnp.arange(slots) // (slots // cache.shards)
    row = shard * per_shard + jnp.maximum(prefix, 0)
    cache = paged_cache.share_rows(cache, store.page_table[row], store.lengths[row], starting)
    return cache, jnp.where(starting[:, None], store.logits[row], logits)
