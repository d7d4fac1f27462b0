"""The one attention interface of the decoder: per path (packed training rows, multi-token
extend over the KV cache, one-token decode), the implementation `model.attention.<path>` names.

"auto" picks by the platform the program is compiled for: the devices of the mesh the step
names (kernel_sharding.kernel_mesh; the plan command's TPU devices from a CPU host), else
`jax.default_backend()`. On the CPU it runs "xla", the plain-jnp code of packed_attention.py / cached_attention.py that every kernel is
tested against, called exactly as before. A kernel that cannot express a masking rule the call
needs (segments, causality, the shared prompt `prefix_ids`) or cannot run on the backend falls
back to "xla" and says why in the log, once per reason; a Pallas kernel asked for off its own
backend runs in Pallas interpret mode (slow; what the CPU tests use), and says so too. Under a
mesh of several devices a kernel runs per shard (kernel_sharding.per_shard: XLA does not
partition a Pallas call). `record()` collects what each path ran while a program is traced (the
plan states it).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
from typing import Iterator, NamedTuple

import jax
import jax.numpy as jnp

from matpo_jax.model.cached_attention import blocked_cached_attention, cached_attention
from matpo_jax.model import kernel_sharding, paged_cache
from matpo_jax.model.config import ATTENTION_KERNELS
from matpo_jax.model.packed_attention import packed_attention

log = logging.getLogger(__name__)

# What "auto" runs for packed training rows on each backend (others: "xla").
AUTO_TRAIN = {"tpu": "splash", "gpu": "cudnn"}
# What "auto" runs for one-token decode steps over a paged cache (others: "xla").
AUTO_PAGED_DECODE = {"tpu": "paged_tpu", "gpu": "paged_gpu"}
PAGED_KERNEL_BACKEND = {"paged_tpu": "tpu", "paged_gpu": "gpu"}
# What "auto" runs for multi-token extends over a paged cache (others: "xla").
AUTO_PAGED_EXTEND = {"tpu": "paged_tpu"}
# The backend each training kernel is compiled for (elsewhere: Pallas interpret mode, or none).
KERNEL_BACKEND = {"splash": "tpu", "cudnn": "gpu", "pallas_gpu": "gpu"}
PALLAS_KERNELS = ("splash", "pallas_gpu")

_logged: set[str] = set()


class AttentionUse(NamedTuple):
    """One attention call as traced: the path, what ran, and the per-shard query shape."""
    path: str  # "train", "extend", "decode"
    implementation: str
    interpret: bool
    sharded: bool  # run per shard under shard_map
    query_shape: tuple  # q as the implementation saw it (per shard when sharded)


_uses: contextvars.ContextVar[list | None] = contextvars.ContextVar("attention_uses",
                                                                   default=None)


@contextlib.contextmanager
def record() -> Iterator[list[AttentionUse]]:
    """The attention calls traced inside this block (a program already traced and cached by jit
    is not traced again, so records only what is traced anew)."""
    uses: list[AttentionUse] = []
    token = _uses.set(uses)
    try:
        yield uses
    finally:
        _uses.reset(token)


def _record(use: AttentionUse) -> None:
    uses = _uses.get()
    if uses is not None:
        uses.append(use)


def implementations(uses: list[AttentionUse]) -> dict[str, str]:
    """{path: implementation(s) it ran} from `record()`'s list, e.g. {"train": "splash"}."""
    found: dict[str, list[str]] = {}
    for use in uses:
        name = use.implementation + (" (interpret)" if use.interpret else "")
        if name not in found.setdefault(use.path, []):
            found[use.path].append(name)
    return {path: ", ".join(names) for path, names in found.items()}


class TrainAttentionPlan(NamedTuple):
    implementation: str  # what runs: "xla" or a kernel name
    interpret: bool  # a Pallas kernel in interpret mode
    note: str | None  # why the choice was changed or how it runs (logged), None if as asked


def plan_train_attention(choice: str, has_prefix: bool, backend: str | None = None
                         ) -> TrainAttentionPlan:
    """What `train_attention` runs for `model.attention.train = choice` on `backend`."""
    if choice not in ATTENTION_KERNELS["train"]:
        raise ValueError(f"model.attention.train must be one of {ATTENTION_KERNELS['train']}, "
                         f"got {choice!r}")
    backend = backend or jax.default_backend()
    name = AUTO_TRAIN.get(backend, "xla") if choice == "auto" else choice
    if name == "xla":
        return TrainAttentionPlan("xla", False, None)
    if name == "pallas_gpu" and has_prefix:
        return TrainAttentionPlan("xla", False, (
            "model.attention.train=pallas_gpu: the kernel compares one segment-id array for "
            "queries and keys and cannot express the shared-prompt rule (prefix_ids); "
            "running xla"))
    if name == "splash" and has_prefix:
        from matpo_jax.model.splash_attention import prefix_rule_unavailable
        reason = prefix_rule_unavailable()
        if reason:
            return TrainAttentionPlan("xla", False, f"model.attention.train=splash: {reason}; "
                                                    "running xla")
    if KERNEL_BACKEND[name] == backend:
        return TrainAttentionPlan(name, False, None)
    if name in PALLAS_KERNELS:
        return TrainAttentionPlan(name, True, (
            f"model.attention.train={name}: a {KERNEL_BACKEND[name]} kernel on {backend}: "
            "running it in Pallas interpret mode (correct, slow)"))
    return TrainAttentionPlan("xla", False, (
        f"model.attention.train={name}: needs a {KERNEL_BACKEND[name]} backend, this is "
        f"{backend}; running xla"))


def _note(message: str | None) -> None:
    if message and message not in _logged:
        _logged.add(message)
        log.warning(message)


def train_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array,
                    prefix_ids: jax.Array | None, choice: str) -> jax.Array:
    """Packed training attention (the contract of packed_attention.packed_attention):
    q [B, T, H, D], k, v [B, T, K, D], segment ids (0 = padding) and optional shared-prompt ids
    [B, T] -> [B, T, H * D]."""
    mesh = kernel_sharding.current_mesh()
    plan = plan_train_attention(choice, prefix_ids is not None,
                                kernel_sharding.mesh_platform(mesh))
    _note(plan.note)
    if plan.implementation == "xla":
        _record(AttentionUse("train", "xla", False, False, tuple(q.shape)))
        return packed_attention(q, k, v, segment_ids, prefix_ids=prefix_ids)
    sharded = mesh is not None and mesh.size > 1

    def kernel(q, k, v, segment_ids, prefix_ids):
        _record(AttentionUse("train", plan.implementation, plan.interpret, sharded,
                             tuple(q.shape)))
        return _train_kernel(plan, q, k, v, segment_ids, prefix_ids)

    if sharded:
        out = kernel_sharding.per_shard(kernel, mesh, q, k, v, segment_ids, prefix_ids)
    else:
        out = kernel(q, k, v, segment_ids, prefix_ids)
    return padding_rows_as_reference(out, v, segment_ids)


def _train_kernel(plan: TrainAttentionPlan, q, k, v, segment_ids, prefix_ids) -> jax.Array:
    if plan.implementation == "splash":
        from matpo_jax.model.splash_attention import splash_packed_attention
        return splash_packed_attention(q, k, v, segment_ids, prefix_ids,
                                       interpret=plan.interpret)
    if plan.implementation == "cudnn":
        from matpo_jax.model.gpu_attention import cudnn_packed_attention
        return cudnn_packed_attention(q, k, v, segment_ids, prefix_ids)
    from matpo_jax.model.gpu_attention import pallas_gpu_packed_attention
    return pallas_gpu_packed_attention(q, k, v, segment_ids, interpret=plan.interpret)


def padding_rows_as_reference(out: jax.Array, v: jax.Array, segment_ids: jax.Array) -> jax.Array:
    """out [B, T, H, D] -> [B, T, H * D] with padding queries (segment 0) given the mean of v over
    the row, as packed_attention does (the loss ignores them; this keeps every path's outputs,
    and v's gradient, equal to the reference's everywhere)."""
    batch, length, heads, head_dim = out.shape
    kv_heads = v.shape[2]
    mean_v = jnp.mean(v.astype(jnp.float32), axis=1).astype(out.dtype)  # [B, K, D]
    mean_v = jnp.repeat(mean_v, heads // kv_heads, axis=1)[:, None]  # [B, 1, H, D]
    out = jnp.where((segment_ids != 0)[:, :, None, None], out, mean_v)
    return out.reshape(batch, length, heads * head_dim)


def _check(path: str, choice: str) -> None:
    if choice not in ATTENTION_KERNELS[path]:
        raise ValueError(f"model.attention.{path} must be one of {ATTENTION_KERNELS[path]}, "
                         f"got {choice!r}")


def extend_attention(q: jax.Array, k: jax.Array, v: jax.Array, positions: jax.Array,
                     lengths: jax.Array, choice: str) -> jax.Array:
    """A multi-token extend over the heads-major (dense) cache (blocked_cached_attention's
    contract): "xla" (the kernels read a paged cache)."""
    _check("extend", choice)
    if choice in PAGED_KERNEL_BACKEND:
        _note(f"model.attention.extend={choice}: the kernel reads a paged KV cache and this "
              "cache is dense (rollout.kv_cache=paged pages it); running xla")
    _record(AttentionUse("extend", "xla", False, False, tuple(q.shape)))
    return blocked_cached_attention(q, k, v, positions, lengths)


def decode_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                     choice: str) -> jax.Array:
    """One-token decode over the heads-major cache (cached_attention's contract). Only "xla"
    exists so far (see docs/attention_kernels.md)."""
    _check("decode", choice)
    if choice in PAGED_KERNEL_BACKEND:
        _note(f"model.attention.decode={choice}: the kernel reads a paged KV cache and this "
              "cache is dense (rollout.kv_cache=paged pages it); running xla")
    _record(AttentionUse("decode", "xla", False, False, tuple(q.shape)))
    return cached_attention(q, k, v, mask)


def plan_paged_decode(choice: str, backend: str | None = None) -> tuple[str, bool, str | None]:
    """(implementation, interpret, note) of a one-token decode step over a paged cache."""
    return _plan_paged("decode", choice, AUTO_PAGED_DECODE, backend)


def plan_paged_extend(choice: str, backend: str | None = None) -> tuple[str, bool, str | None]:
    """(implementation, interpret, note) of a multi-token extend over a paged cache."""
    return _plan_paged("extend", choice, AUTO_PAGED_EXTEND, backend)


def _plan_paged(path: str, choice: str, auto: dict, backend: str | None):
    _check(path, choice)
    backend = backend or jax.default_backend()
    name = auto.get(backend, "xla") if choice == "auto" else choice
    kernel_backend = PAGED_KERNEL_BACKEND.get(name)
    if kernel_backend is None or backend == kernel_backend:
        return name, False, None
    return name, True, (f"model.attention.{path}={name}: a {kernel_backend} kernel on {backend}: "
                        "running it in Pallas interpret mode (correct, slow)")


def paged_attention(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, view,
                    extend_choice: str, decode_choice: str) -> jax.Array:
    """New queries q [B, T, H, D] over a layer's pages (k_pages, v_pages [K, N, P, D], the new
    tokens already written) and a `paged_cache.PagedView` -> [B, T, H * D]. A one-token decode
    step may run a paged kernel (TPU or GPU), a multi-token extend the TPU extend kernel
    (paged_extend_kernel.py); otherwise the XLA reference."""
    batch, length, heads, head_dim = q.shape
    if length == 1:
        name, interpret, note = plan_paged_decode(decode_choice,
                                                  kernel_sharding.mesh_platform(
                                                      kernel_sharding.current_mesh()))
        _note(note)
        if name in PAGED_KERNEL_BACKEND:
            from matpo_jax.model import paged_attention as kernels
            _record(AttentionUse("decode", name, interpret, False, tuple(q.shape)))
            kernel = functools.partial(kernels.tpu_paged_decode_attention if name == "paged_tpu"
                                       else kernels.gpu_paged_decode_attention,
                                       interpret=interpret)
            mesh = kernel_sharding.current_mesh()
            # Rows that write nothing this step (inactive slots) still attend their own pages.
            out = (kernel(q[:, 0], k_pages, v_pages, view.page_table, view.lengths)
                   if mesh is None else kernel_sharding.per_shard_paged(
                       kernel, mesh, q[:, 0], k_pages, v_pages, view.page_table, view.lengths))
            return out.reshape(batch, 1, heads * head_dim)
        _record(AttentionUse("decode", "xla", False, False, tuple(q.shape)))
    else:
        name, interpret, note = plan_paged_extend(extend_choice,
                                                  kernel_sharding.mesh_platform(
                                                      kernel_sharding.current_mesh()))
        _note(note)
        if name == "paged_tpu":
            from matpo_jax.model.paged_extend_kernel import tpu_paged_extend_attention
            _record(AttentionUse("extend", name, interpret, False, tuple(q.shape)))
            kernel = functools.partial(tpu_paged_extend_attention, interpret=interpret)
            mesh = kernel_sharding.current_mesh()
            return (kernel(q, k_pages, v_pages, view.page_table, view.lengths, view.positions)
                    if mesh is None else kernel_sharding.per_shard_paged_extend(
                        kernel, mesh, q, k_pages, v_pages, view.page_table, view.lengths,
                        view.positions))
        _record(AttentionUse("extend", "xla", False, False, tuple(q.shape)))
    return paged_cache.paged_attention_reference(q, k_pages, v_pages, view.page_table,
                                                 view.lengths, view.positions)
