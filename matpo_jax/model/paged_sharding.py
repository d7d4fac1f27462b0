"""A page pool per batch shard: running the paged cache's operations on each shard's own pool.

On a mesh that splits the decode slots over the batch axes ("data" x "fsdp" = S shards), the
paged cache (paged_cache.py) is S independent caches laid side by side: shard s holds its slots
(a contiguous block of rows, as the slots' sharding splits them), pages [s * N/S, (s+1) * N/S)
of every layer's pool, and its own free stack, reference counts and overflow flag. Page tables
hold page ids local to their shard's pool, so each operation (reserve, release, advance, share,
write, attend) is the one-pool code run under `shard_map` on every shard's piece, with no
communication: no page of one shard is ever read or written by another, and every chip holds
only its part of the pool. A cache with one shard (no mesh, or a mesh that does not split the
slots) is the one-pool cache itself and runs the one-pool code directly.

What a sharded cache's rows must be: whatever rows an operation sees (the whole cache, or the
sub-cache of an injection's lanes, `writes.inject`), the first rows/S are shard 0's, the next
shard 1's, and so on. The slot loop keeps that order: lanes are picked per shard, and the prompt
prefixes are stored once per shard.
"""
from __future__ import annotations

import math
from typing import Callable

import jax
from jax.sharding import Mesh, PartitionSpec as P

from matpo_jax.model import kernel_sharding
from matpo_jax.model.kernel_sharding import batch_axes

TENSOR_AXIS = kernel_sharding.TENSOR_AXIS


def batch_shards(mesh: Mesh | None) -> int:
    """How many pools a paged cache has on `mesh`: the product of its batch axes."""
    return math.prod(mesh.shape[a] for a in batch_axes(mesh)) if mesh is not None else 1


def current_shards() -> int:
    """Batch shards of the kernel mesh being traced under (1 without one)."""
    return batch_shards(kernel_sharding.current_mesh())


def sharded_mesh(shards: int) -> Mesh:
    """The kernel mesh a cache of `shards` pools runs on; an error naming the mismatch otherwise
    (a sharded cache used outside `kernel_mesh`, or on a mesh of another batch split)."""
    mesh = kernel_sharding.current_mesh()
    if batch_shards(mesh) != shards:
        raise ValueError(f"a paged KV cache with a pool per batch shard ({shards} shards) runs "
                         f"under kernel_mesh of a mesh splitting the batch {shards} ways; the "
                         f"current kernel mesh splits it {batch_shards(mesh)} ways")
    return mesh


def head_axis(mesh: Mesh, kv_heads: int) -> str | None:
    """"tensor" where it splits the pool's kv heads evenly (as the k/v projections split them),
    else None: the heads stay whole on every chip."""
    tensor = mesh.shape.get(TENSOR_AXIS, 1)
    return TENSOR_AXIS if tensor > 1 and kv_heads % tensor == 0 else None


def pool_spec(mesh: Mesh, kv_heads: int) -> P:
    """A layer's pool [kv_heads, pages, page_size, head_dim]: kv heads over tensor, pages over
    the batch axes (each shard's pages are its own pool)."""
    return P(head_axis(mesh, kv_heads), batch_axes(mesh) or None, None, None)


def rows_spec(mesh: Mesh) -> P:
    """Anything whose first axis is rows or per-shard state: split over the batch axes."""
    return P(batch_axes(mesh) or None)


def cache_specs(cache, mesh: Mesh):
    """The PartitionSpecs of a sharded PagedKVCache (the same NamedTuple type)."""
    pools = tuple(pool_spec(mesh, k.shape[0]) for k in cache.k)
    rows = rows_spec(mesh)
    return cache._replace(k=pools, v=pools, page_table=rows, lengths=rows, refcount=rows,
                          free=rows, num_free=rows, overflow=rows)


def _local(cache):
    """A shard's piece as a one-pool cache: its [1] counters as scalars."""
    return cache._replace(num_free=cache.num_free[0], overflow=cache.overflow[0])


def _stacked(cache):
    return cache._replace(num_free=cache.num_free[None], overflow=cache.overflow[None])


def on_shards(fn: Callable, cache, *row_args):
    """fn(cache, *row_args) -> cache, run on each shard's pool and rows (row_args: arrays whose
    first axis is the cache's rows). A one-shard cache runs fn directly."""
    if cache.shards == 1:
        return fn(cache, *row_args)
    mesh = sharded_mesh(cache.shards)
    specs = cache_specs(cache, mesh)
    return jax.shard_map(lambda c, *a: _stacked(fn(_local(c), *a)), mesh=mesh,
                         in_specs=(specs,) + (rows_spec(mesh),) * len(row_args),
                         out_specs=specs, check_vma=False)(cache, *row_args)


def write_on_shards(fn: Callable, k_pages, v_pages, page_table, positions, k_new, v_new,
                    num_valid):
    """paged_cache.write's contract (fn is the one-pool write), on each shard under the current
    kernel mesh when it splits the batch."""
    mesh = kernel_sharding.current_mesh()
    if batch_shards(mesh) == 1:
        return fn(k_pages, v_pages, page_table, positions, k_new, v_new, num_valid)
    pool = pool_spec(mesh, k_pages.shape[0])
    rows = rows_spec(mesh)
    new = P(rows[0], None, pool[0], None)  # [B, T, kv_heads, D]: the pool's head split
    return jax.shard_map(fn, mesh=mesh, in_specs=(pool, pool, rows, rows, new, new, rows),
                         out_specs=(pool, pool), check_vma=False)(
        k_pages, v_pages, page_table, positions, k_new, v_new, num_valid)


def attend_on_shards(fn: Callable, q, k_pages, v_pages, page_table, lengths, positions):
    """paged_cache.paged_attention_reference's contract (q [B, T, H, D] -> [B, T, H * D]), on
    each shard under the current kernel mesh when it splits the batch."""
    mesh = kernel_sharding.current_mesh()
    if batch_shards(mesh) == 1:
        return fn(q, k_pages, v_pages, page_table, lengths, positions)
    pool = pool_spec(mesh, k_pages.shape[0])
    rows = rows_spec(mesh)
    return jax.shard_map(fn, mesh=mesh,
                         in_specs=(P(rows[0], None, pool[0], None), pool, pool, rows, rows, rows),
                         out_specs=P(rows[0], None, pool[0]), check_vma=False)(
        q, k_pages, v_pages, page_table, lengths, positions)
