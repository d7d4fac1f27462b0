"""Running an attention kernel on the mesh the model's program is compiled for.

XLA's SPMD partitioner does not partition a Pallas call (nor any custom call it cannot see
into): in a sharded train step the kernel has to run on each chip's own rows and heads. The step
builders (trainer/step.py) and the plan name their mesh with `kernel_mesh(mesh)` while the model
is traced; `per_shard` then runs a kernel under `shard_map` over that mesh: the batch over the
batch axes ("data", "fsdp") and the heads over "tensor", the layout the projections' partition
rules already give q, k and v (parallel/partitioning.py), so no resharding is added around it.

The mesh also tells which platform the program is for: the plan command compiles for TPU devices
from a CPU host, and there `model.attention.*=auto` must resolve for the TPU, not for the host.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Callable, Iterator

import jax
from jax.sharding import Mesh, PartitionSpec as P

from matpo_jax.parallel.mesh import BATCH_AXES

TENSOR_AXIS = "tensor"

_mesh: contextvars.ContextVar[Mesh | None] = contextvars.ContextVar("kernel_mesh", default=None)


@contextlib.contextmanager
def kernel_mesh(mesh: Mesh | None) -> Iterator[None]:
    """While tracing inside this block, attention kernels run per shard of `mesh` and `auto`
    resolves for its devices' platform."""
    token = _mesh.set(mesh)
    try:
        yield
    finally:
        _mesh.reset(token)


def current_mesh() -> Mesh | None:
    return _mesh.get()


def mesh_platform(mesh: Mesh | None) -> str | None:
    """"tpu", "gpu", "cpu" for the mesh's devices; None without a mesh."""
    if mesh is None:
        return None
    platform = mesh.devices.flat[0].platform
    return "gpu" if platform in ("cuda", "rocm") else platform


def batch_axes(mesh: Mesh | None) -> tuple[str, ...]:
    """The mesh's batch axes that split anything (size > 1)."""
    if mesh is None:
        return ()
    return tuple(a for a in BATCH_AXES if a in mesh.axis_names and mesh.shape[a] > 1)


def shard_specs(mesh: Mesh, batch: int, heads: int, kv_heads: int) -> tuple[P, P]:
    """(spec of q / k / v [B, T, heads, D], spec of ids [B, T]). An axis that does not divide its
    dimension is left out (that dimension is then replicated: correct, only redundant), and heads
    go over "tensor" only if both the query and the kv heads divide, so each chip keeps whole
    groups of query heads with their kv head."""
    rows = batch_axes(mesh)
    if batch % math.prod(mesh.shape[a] for a in rows):
        rows = ()
    tensor = mesh.shape.get(TENSOR_AXIS, 1)
    head_axis = TENSOR_AXIS if tensor > 1 and heads % tensor == 0 and kv_heads % tensor == 0 \
        else None
    rows = rows or None
    return P(rows, None, head_axis, None), P(rows, None)


def per_shard(kernel: Callable, mesh: Mesh, q: jax.Array, k: jax.Array, v: jax.Array,
              segment_ids: jax.Array, prefix_ids: jax.Array | None) -> jax.Array:
    """kernel(q, k, v, segment_ids, prefix_ids) -> [B, T, H, D], run under shard_map over `mesh`
    (each chip: its rows, its heads); the result is laid out as q."""
    heads_spec, ids_spec = shard_specs(mesh, q.shape[0], q.shape[2], k.shape[2])
    # check_vma off: the Pallas kernels declare their outputs without varying mesh axes.
    if prefix_ids is None:
        return jax.shard_map(lambda q, k, v, s: kernel(q, k, v, s, None), mesh=mesh,
                             in_specs=(heads_spec,) * 3 + (ids_spec,), out_specs=heads_spec,
                             check_vma=False)(q, k, v, segment_ids)
    return jax.shard_map(kernel, mesh=mesh, in_specs=(heads_spec,) * 3 + (ids_spec,) * 2,
                         out_specs=heads_spec, check_vma=False)(q, k, v, segment_ids, prefix_ids)


def _paged_axes(mesh: Mesh, heads: int, kv_heads: int) -> tuple:
    """(batch axes, head axis) a paged kernel runs over: rows and pages over the batch axes that
    split anything (each batch shard's own pool, paged_sharding.py), heads over "tensor" where
    it divides both the query and the kv heads."""
    tensor = mesh.shape.get(TENSOR_AXIS, 1)
    split = tensor > 1 and heads % tensor == 0 and kv_heads % tensor == 0
    return batch_axes(mesh) or None, TENSOR_AXIS if split else None


def per_shard_paged(kernel: Callable, mesh: Mesh, q: jax.Array, k_pages: jax.Array,
                    v_pages: jax.Array, page_table: jax.Array, lengths: jax.Array) -> jax.Array:
    """kernel(q [B, H, D], k_pages, v_pages [K, N, P, D], page_table, lengths) -> [B, H, D] under
    shard_map over `mesh`: each chip its heads of its rows, its kv heads of its shard's pages (the
    layout `parallel.paged_cache_shardings` gives the pools; on a mesh that splits the batch, each
    batch shard's rows hold page ids of its own pool, paged_sharding.py)."""
    rows, heads = _paged_axes(mesh, q.shape[1], k_pages.shape[0])
    q_spec, pool_spec = P(rows, heads, None), P(heads, rows, None, None)
    return jax.shard_map(kernel, mesh=mesh, in_specs=(q_spec, pool_spec, pool_spec, P(rows),
                                                      P(rows)),
                         out_specs=q_spec, check_vma=False)(q, k_pages, v_pages, page_table,
                                                            lengths)


def per_shard_paged_extend(kernel: Callable, mesh: Mesh, q: jax.Array, k_pages: jax.Array,
                           v_pages: jax.Array, page_table: jax.Array, lengths: jax.Array,
                           positions: jax.Array) -> jax.Array:
    """kernel(q [B, T, H, D], k_pages, v_pages, page_table, lengths, positions) -> [B, T, H * D]
    under shard_map over `mesh`, laid out as `per_shard_paged` lays out a decode step."""
    rows, heads = _paged_axes(mesh, q.shape[2], k_pages.shape[0])
    pool_spec = P(heads, rows, None, None)
    return jax.shard_map(kernel, mesh=mesh,
                         in_specs=(P(rows, None, heads, None), pool_spec, pool_spec, P(rows),
                                   P(rows), P(rows)),
                         out_specs=P(rows, None, heads), check_vma=False)(
        q, k_pages, v_pages, page_table, lengths, positions)
