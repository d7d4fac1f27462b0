"""Packed training attention through the TPU Pallas splash-attention kernel.

The kernel takes a static mask (here: causal) and-ed with per-token segment ids (a query sees a
key only if their ids are equal), vmapped over the batch and the kv heads (its MQA form: one
key/value head, `group` query heads). Segments and causality map straight onto it; the shared-
prompt rule (a query of a segment that continues prompt segment p also sees p's keys) does not,
since a query may then match two ids. It is built from two kernel calls over disjoint key sets
whose softmaxes are merged by their log-sum-exps:

  own:    query segment ids  = segment_ids,        key ids = segment_ids
  prompt: query segment ids  = prefix_ids (0: -1),  key ids = segment_ids
  out = (exp(lse_own - L) * out_own + exp(lse_prompt - L) * out_prompt),  L = logaddexp(...)

Its backward runs the kernel's own backward for each part with the MERGED output and log-sum-
exp as residuals: each part's probabilities are then exp(score - L), the merged ones restricted
to its keys, and the row term rowsum(dO * O) is the merged one, so the two parts' gradients add
up to the exact gradient. That backward is the kernel module's private `_splash_attention_bwd`
(jax 0.10); where it is missing, `prefix_rule_unavailable()` says why and the caller falls back.

Block sizes: the largest of 512, 256, 128 that divides the (128-padded) length; 512 keeps a v5e
/ v5p core's MXU busy with a score tile of 1 MiB in float32 (and is MaxText's choice there).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

# The kernel's lane width: lengths are padded to a multiple of it.
LANES = 128
BLOCK_CHOICES = (512, 256, 128)


def _kernel_modules():
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as kernel_lib, splash_attention_mask as mask_lib)
    return kernel_lib, mask_lib


def prefix_rule_unavailable() -> str | None:
    """Why the shared-prompt rule cannot run through splash here, or None if it can."""
    kernel_lib, _ = _kernel_modules()
    if not callable(getattr(kernel_lib, "_splash_attention_bwd", None)):
        return ("this jax's splash_attention_kernel has no _splash_attention_bwd, which the "
                "prompt rule's merged backward calls")
    return None


def block_size(length: int) -> int:
    return next(b for b in BLOCK_CHOICES if length % b == 0)


@functools.lru_cache(maxsize=None)
def _kernel(length: int, group: int, block: int, interpret: bool, save_residuals: bool):
    kernel_lib, mask_lib = _kernel_modules()
    mask = mask_lib.MultiHeadMask([mask_lib.CausalMask((length, length))] * group)
    sizes = kernel_lib.BlockSizes(
        block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
        block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    # The kernel object (cached) holds its mask-info arrays: made concrete, never tracers of
    # whichever program first asked for it (a later program would find them leaked).
    with jax.ensure_compile_time_eval():
        return kernel_lib.make_splash_mqa_single_device(
            mask=mask, block_sizes=sizes, interpret=interpret, save_residuals=save_residuals)


def _batched(fn):
    """fn over (q [G, T, D], k [T, D], v [T, D], ids) -> over [B, K, ...] (ids [B, T] each)."""
    return jax.vmap(jax.vmap(fn, in_axes=(0, 0, 0, None)), in_axes=(0, 0, 0, 0))


def _segments(q_ids, kv_ids):
    kernel_lib, _ = _kernel_modules()
    return kernel_lib.SegmentIds(q=q_ids, kv=kv_ids)


def _own_and_prompt_ids(segment_ids, prefix_ids):
    # Queries without a prompt get id -1, which no key carries (keys' ids are >= 0).
    return ((segment_ids, segment_ids),
            (jnp.where(prefix_ids > 0, prefix_ids, -1), segment_ids))


def _merged_forward(q, k, v, segment_ids, prefix_ids, interpret):
    length, group = q.shape[3], q.shape[2]
    kernel = _kernel(length, group, block_size(length), interpret, True)
    parts = [_batched(lambda q, k, v, ids: kernel(q, k, v, segment_ids=_segments(*ids)))(
        q, k, v, ids) for ids in _own_and_prompt_ids(segment_ids, prefix_ids)]
    (out_own, (lse_own,)), (out_prompt, (lse_prompt,)) = parts
    has_prompt = (prefix_ids > 0)[:, None, None, :]  # [B, 1, 1, T]
    lse_prompt = jnp.where(has_prompt, lse_prompt, -jnp.inf)
    lse = jnp.logaddexp(lse_own, lse_prompt)
    merged = (jnp.exp(lse_own - lse)[..., None] * out_own.astype(jnp.float32)
              + jnp.exp(lse_prompt - lse)[..., None]
              * jnp.where(has_prompt[..., None], out_prompt.astype(jnp.float32), 0.0))
    out = jnp.where(has_prompt[..., None], merged.astype(q.dtype), out_own)
    return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _with_prompt(q, k, v, segment_ids, prefix_ids, interpret):
    return _merged_forward(q, k, v, segment_ids, prefix_ids, interpret)[0]


def _with_prompt_fwd(q, k, v, segment_ids, prefix_ids, interpret):
    out, lse = _merged_forward(q, k, v, segment_ids, prefix_ids, interpret)
    return out, (q, k, v, segment_ids, prefix_ids, out, lse)


def _with_prompt_bwd(interpret, residuals, d_out):
    kernel_lib, _ = _kernel_modules()
    q, k, v, segment_ids, prefix_ids, out, lse = residuals
    length, group = q.shape[3], q.shape[2]
    kernel = _kernel(length, group, block_size(length), interpret, False)
    options = {name: kernel.kwargs[name] for name in (
        "save_residuals", "mask_value", "is_mqa", "block_sizes", "residual_checkpoint_name",
        "mask_function", "attn_logits_soft_cap", "interpret")}

    def part_grads(q, k, v, out, lse, d_out, ids):
        # The kernel's backward with the merged (out, lse): exact gradients of this part's keys.
        res = (q, k, v, _segments(*ids), None, out, lse, kernel.dq_mask_info, kernel.dkv_mask_info)
        grads = kernel_lib._splash_attention_bwd(*options.values(), res, d_out)
        return tuple(g.astype(jnp.float32) for g in grads[3:6])

    batched = jax.vmap(jax.vmap(part_grads, in_axes=(0, 0, 0, 0, 0, 0, None)),
                       in_axes=(0, 0, 0, 0, 0, 0, 0))
    total = None
    for ids in _own_and_prompt_ids(segment_ids, prefix_ids):
        grads = batched(q, k, v, out, lse, d_out, ids)
        total = grads if total is None else tuple(a + b for a, b in zip(total, grads))
    dq, dk, dv = total
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None


_with_prompt.defvjp(_with_prompt_fwd, _with_prompt_bwd)


def splash_packed_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array,
                            prefix_ids: jax.Array | None = None,
                            interpret: bool = False) -> jax.Array:
    """Causal attention within equal segment ids (and into the shared prompt `prefix_ids`
    names), through splash attention. q: [B, T, H, D]; k, v: [B, T, K, D]; ids [B, T] int.
    Returns [B, T, H, D]; rows of segment 0 (padding) are left to the caller (see
    attention_dispatch). `interpret` runs the Pallas kernels in interpret mode (any backend)."""
    batch, length, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads
    padded = -(-length // LANES) * LANES

    def pad(x):  # padding tokens get segment id 0: no real query reaches them
        return jnp.pad(x, ((0, 0), (0, padded - length)) + ((0, 0),) * (x.ndim - 2))

    q_s = q * jnp.asarray(head_dim ** -0.5, q.dtype)
    q_g = pad(q_s).reshape(batch, padded, kv_heads, group, head_dim).transpose(0, 2, 3, 1, 4)
    k_t, v_t = pad(k).transpose(0, 2, 1, 3), pad(v).transpose(0, 2, 1, 3)  # [B, K, T, D]
    segment_ids = pad(segment_ids.astype(jnp.int32))
    if prefix_ids is None:
        kernel = _kernel(padded, group, block_size(padded), interpret, False)
        out = _batched(lambda q, k, v, ids: kernel(q, k, v, segment_ids=_segments(ids, ids)))(
            q_g, k_t, v_t, segment_ids)
    else:
        out = _with_prompt(q_g, k_t, v_t, segment_ids, pad(prefix_ids.astype(jnp.int32)),
                           interpret)
    # [B, K, G, T, D] -> [B, T, H, D]
    return out[:, :, :, :length].transpose(0, 3, 1, 2, 4).reshape(batch, length, heads, head_dim)
