"""What a multi-process run needs besides the global mesh: each process's share of a batch, a
process-local copy of the parameters for its own sampler, global arrays from per-process rows,
and small host values gathered from every process.

With one process every function here is the identity (or its one-process equivalent), so the
single-process path runs no collective.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from matpo_jax.parallel.mesh import MESH_AXES, make_mesh
from matpo_jax.parallel.partitioning import fit_spec


def is_primary() -> bool:
    """Process 0: the one that writes metrics, evaluation, plots and the summary."""
    return jax.process_index() == 0


def process_slice(global_size: int) -> slice:
    """This process's contiguous share of `global_size` items (divisible by the process count)."""
    count, index = jax.process_count(), jax.process_index()
    if global_size % count:
        raise ValueError(f"{global_size} items do not split over {count} processes")
    share = global_size // count
    return slice(index * share, (index + 1) * share)


def allgather(values) -> np.ndarray:
    """[processes, ...]: every process's `values` (same shape and dtype everywhere)."""
    values = np.asarray(values)
    if jax.process_count() == 1:
        return values[None]
    return np.asarray(multihost_utils.process_allgather(values))


def allgather_objects(value: Any) -> list:
    """Every process's JSON-able `value`, in process order."""
    if jax.process_count() == 1:
        return [value]
    text = np.frombuffer(json.dumps(value).encode(), dtype=np.uint8)
    longest = int(allgather(np.array([text.size])).max())
    padded = np.zeros(longest, np.uint8)
    padded[:text.size] = text
    return [json.loads(bytes(row).rstrip(b"\0").decode()) for row in allgather(padded)]


def broadcast_object(value: Any) -> Any:
    """Process 0's JSON-able `value`, on every process (a decision all must share)."""
    return allgather_objects(value)[0]


def barrier(name: str) -> None:
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


# ---------------------------------------------------------------------------- the local sampler
def local_mesh(mesh: Mesh) -> Mesh:
    """The mesh of this process's devices for its own sampler: the global mesh's tensor axis
    (kept within a host), fsdp divided by the process count where it divides, data the rest."""
    count = jax.process_count()
    if count == 1:
        return mesh
    devices = jax.local_devices()
    tensor = mesh.shape["tensor"]
    fsdp = mesh.shape["fsdp"] // count if mesh.shape["fsdp"] % count == 0 else 1
    if len(devices) % (tensor * fsdp):
        tensor, fsdp = 1, 1
    return make_mesh(dict(data=-1, fsdp=fsdp, tensor=tensor), devices=devices)


def _local_sharding(sharding, mesh: Mesh):
    spec = sharding.spec if isinstance(sharding, NamedSharding) else P()
    return NamedSharding(mesh, P(*(_axes_in(entry, mesh) for entry in spec)))


def _axes_in(entry, mesh: Mesh):
    """A spec entry with the axes `mesh` lacks or cannot split dropped (data/fsdp/tensor only)."""
    if entry is None:
        return None
    names = (entry,) if isinstance(entry, str) else tuple(entry)
    kept = tuple(n for n in names if n in MESH_AXES and mesh.shape[n] > 1)
    return kept or None


_REPLICATORS: dict = {}


def _replicator(mesh: Mesh):
    """A jitted identity whose output is replicated over `mesh`: the all-gather (compiled once per
    leaf shape, reused every step)."""
    if mesh not in _REPLICATORS:
        _REPLICATORS[mesh] = jax.jit(lambda x: x, out_shardings=NamedSharding(mesh, P()))
    return _REPLICATORS[mesh]


def to_local(tree, mesh: Mesh):
    """`tree` (arrays over the global mesh) as arrays over this process's `mesh`, same specs.

    Cost: each leaf is all-gathered to every device of every process (one collective per leaf,
    so the peak is one replicated leaf, not the whole model) and then resliced locally: a full
    copy of the parameters crosses the network once per RL step. The single-process path
    returns `tree` unchanged."""
    if jax.process_count() == 1:
        return tree
    def localize(leaf):
        if not isinstance(leaf, jax.Array) or leaf.is_fully_addressable:
            return leaf
        replicated = _replicator(leaf.sharding.mesh)(leaf)
        host_copy = np.asarray(replicated.addressable_data(0))
        target = _local_sharding(leaf.sharding, mesh)
        fitted = NamedSharding(mesh, fit_spec(target.spec, host_copy.shape, mesh))
        return jax.device_put(host_copy, fitted)
    return jax.tree.map(localize, tree)


# ---------------------------------------------------------------------------- global arrays
def global_rows(tree, sharding: NamedSharding):
    """Per-process rows (numpy leaves; each process's own, same shape on every process) as
    global arrays over `sharding` whose leading axis is the concatenation in process order.
    One process: the tree unchanged (the train step places it)."""
    if jax.process_count() == 1:
        return tree

    def build(x):
        if x is None:
            return None
        x = np.asarray(x)
        global_shape = (x.shape[0] * jax.process_count(), *x.shape[1:])
        return jax.make_array_from_process_local_data(sharding, x, global_shape)
    return jax.tree.map(build, tree, is_leaf=lambda x: x is None)


def local_rows(array) -> np.ndarray:
    """This process's rows of a global array split on its leading axis (the inverse of
    `global_rows`); a fully addressable array whole."""
    if not isinstance(array, jax.Array) or array.is_fully_addressable:
        return np.asarray(array)
    shards = {}
    for shard in array.addressable_shards:
        shards.setdefault(shard.index[0].start or 0, np.asarray(shard.data))
    return np.concatenate([shards[start] for start in sorted(shards)])


# ---------------------------------------------------------------------------- metrics
# How a per-process metric of the RL step combines into the global one (by name).
_SUMMED = ("rollouts/", "invalid_tool_calls", "tool_failures", "reward/judge_failures",
           "packed_rows", "trained_tokens", "trained_sequences", "sequences",
           "rollout/decode_steps", "rollout/host_calls",
           "rollout/errors", "rollout/tool_timeouts", "rollout/worker_calls_over_limit",
           "rollout/tool_calls_over_limit")


_RATIOS = {"trained_sequence_frac": ("trained_sequences", "sequences")}


def combine_metrics(per_process: Sequence[dict]) -> dict:
    """One process's view of the global metrics from every process's dict: counts summed,
    `_min`/`_max` the extremes, times the slowest process, everything else the mean over the
    processes that report it. Means of per-planner quantities (reward/*, accuracy) are exact,
    since every process holds the same number of questions x G; means of per-worker or
    per-token quantities weigh the processes equally (approximate)."""
    if len(per_process) == 1:
        return dict(per_process[0])
    out = {}
    for key in dict.fromkeys(k for m in per_process for k in m):
        values = np.asarray([m[key] for m in per_process if key in m], np.float64)
        if key.startswith(_SUMMED) or key in _SUMMED:
            out[key] = float(values.sum())
        elif any(part.endswith("_min") for part in key.split("/")):  # "x_min/worker" too
            out[key] = float(values.min())
        elif any(part.endswith("_max") for part in key.split("/")) or key.startswith("time_"):
            out[key] = float(values.max())
        else:
            out[key] = float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")
    for ratio, (numerator, denominator) in _RATIOS.items():  # exact from the summed counts
        if ratio in out and out.get(denominator):
            out[ratio] = out[numerator] / out[denominator]
    return out
