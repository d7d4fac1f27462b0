"""Regex partition rules for the decoder's parameters (every family) and KV cache over the
("data", "fsdp", "tensor") mesh: kernels split on the model dimension over "fsdp" and on heads /
intermediate / vocabulary over "tensor"."""
from __future__ import annotations

import re
from typing import Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from matpo_jax.parallel.mesh import BATCH_AXES

# (regex searched in the '/'-joined parameter path, spec). First match wins; every parameter must
# match one. Kernels are [in, out]: the model dimension goes on "fsdp", the heads / intermediate /
# vocabulary dimension on "tensor" so each chip holds whole slices of the matmuls.
PARTITION_RULES: list[tuple[str, P]] = [
    (r"embed_tokens/embedding$", P("tensor", "fsdp")),  # [vocab, hidden]
    (r"self_attn/(q|k|v)_proj/kernel$", P("fsdp", "tensor")),  # [hidden, heads * head_dim]
    (r"self_attn/(q|k|v)_proj/bias$", P("tensor")),  # [heads * head_dim] (Qwen2)
    (r"self_attn/o_proj/kernel$", P("tensor", "fsdp")),  # [heads * head_dim, hidden]
    (r"mlp/(gate|up)_proj/kernel$", P("fsdp", "tensor")),  # [hidden, intermediate]
    (r"mlp/down_proj/kernel$", P("tensor", "fsdp")),  # [intermediate, hidden]
    (r"lm_head/kernel$", P("fsdp", "tensor")),  # [hidden, vocab]
    (r"norm/scale$", P()),  # every RMSNorm (layer, q/k, final): tiny, replicated
    # LoRA adapters [adapters, in, rank] / [adapters, rank, out] (model/lora.py): a rank-r slice
    # of each projection, replicated (every device applies them to its own rows).
    (r"_proj/lora_(a|b)$", P()),
]


class UnmatchedParameterError(KeyError):
    """A parameter path that no partition rule covers."""

    def __str__(self):
        return str(self.args[0])




def spec_for(path: str, rules: Sequence[tuple[str, P]] = PARTITION_RULES) -> P:
    """The PartitionSpec of the first rule whose regex matches `path`."""
    for pattern, spec in rules:
        if re.search(pattern, path):
            return spec
    raise UnmatchedParameterError(f"no partition rule matches parameter '{path}'")


def path_to_str(key_path) -> str:
    """'/'-joined name of a key path into an nnx State, e.g. 'layers/0/mlp/up_proj/kernel'."""
    parts = []
    for key in key_path:
        if isinstance(key, jax.tree_util.DictKey):
            parts.append(str(key.key))
        elif isinstance(key, jax.tree_util.SequenceKey):
            parts.append(str(key.idx))
        elif isinstance(key, jax.tree_util.GetAttrKey):
            if key.name != "value":  # the array inside an nnx.Variable
                parts.append(key.name)
        else:
            parts.append(str(key))
    return "/".join(parts)


def fit_spec(spec: P, shape: Sequence[int], mesh: Mesh) -> P:
    """Drops mesh axes from dimensions they do not divide evenly (e.g. an odd vocabulary size),
    so any checkpoint loads; those dimensions are replicated instead."""
    fitted = []
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        names = (axes,) if isinstance(axes, str) else tuple(axes or ())
        size = int(np.prod([mesh.shape[a] for a in names])) if names else 1
        fitted.append(axes if dim % size == 0 else None)
    while fitted and fitted[-1] is None:  # P() and P(None) mean the same; keep the short form
        fitted.pop()
    return P(*fitted)


def sharding_for(path: str, shape: Sequence[int], mesh: Mesh,
                 rules: Sequence[tuple[str, P]] = PARTITION_RULES) -> NamedSharding:
    """The rule sharding of one array. Scalars (e.g. an optimizer's step count) are replicated
    without consulting the rules, so optimizer states shard with the same rules as parameters."""
    if len(shape) == 0:
        return NamedSharding(mesh, P())
    return NamedSharding(mesh, fit_spec(spec_for(path, rules), shape, mesh))


def param_shardings(state, mesh: Mesh, rules: Sequence[tuple[str, P]] | None = None):
    """A tree shaped like `state` (an nnx.State or any pytree of arrays) holding NamedShardings."""
    rules = PARTITION_RULES if rules is None else rules
    return jax.tree_util.tree_map_with_path(
        lambda key_path, leaf: sharding_for(path_to_str(key_path), np.shape(leaf), mesh, rules),
        state)


def shard_model(model: nnx.Module, mesh: Mesh, rules: Sequence[tuple[str, P]] | None = None):
    """Moves every parameter of `model` onto its rule sharding, in place; returns the model."""
    state = nnx.state(model)
    nnx.update(model, jax.device_put(state, param_shardings(state, mesh, rules)))
    return model


def cache_shardings(cache, mesh: Mesh):
    """Shardings for a KVCache (same NamedTuple type): each layer's k [batch, kv_heads, head_dim,
    max_len] and v [batch, kv_heads, max_len, head_dim] split on batch and, like the k/v
    projections, on kv heads; lengths on batch. A paged cache: `paged_cache_shardings`."""
    if hasattr(cache, "page_table"):
        return paged_cache_shardings(cache, mesh)
    kv_spec = P(BATCH_AXES, "tensor", None, None)

    def layer_shardings(arrays):
        return tuple(NamedSharding(mesh, fit_spec(kv_spec, x.shape, mesh)) for x in arrays)

    return cache._replace(
        k=layer_shardings(cache.k), v=layer_shardings(cache.v),
        lengths=NamedSharding(mesh, fit_spec(P(BATCH_AXES), cache.lengths.shape, mesh)))


def paged_cache_shardings(cache, mesh: Mesh):
    """Shardings for a paged_cache.PagedKVCache: each layer's pools [kv_heads, pages, page_size,
    head_dim] split on kv heads over "tensor" (as the k/v projections split them). A one-pool
    cache keeps its page tables, lengths and free-page stack replicated: every chip runs the same
    allocation and holds its heads of every page. A cache with a pool per batch shard
    (model/paged_sharding.py) splits pages, rows and allocation state over "data" x "fsdp":
    each shard holds its own pool and the state that allocates from it."""
    if cache.shards > 1:
        from matpo_jax.model import paged_sharding
        return jax.tree_util.tree_map(lambda spec: NamedSharding(mesh, spec),
                                      paged_sharding.cache_specs(cache, mesh),
                                      is_leaf=lambda x: isinstance(x, P))
    pool_spec = P("tensor", None, None, None)
    everywhere = NamedSharding(mesh, P())

    def pools(arrays):
        return tuple(NamedSharding(mesh, fit_spec(pool_spec, x.shape, mesh)) for x in arrays)

    return cache._replace(k=pools(cache.k), v=pools(cache.v), page_table=everywhere,
                          lengths=everywhere, refcount=everywhere, free=everywhere,
                          num_free=everywhere, overflow=everywhere)
