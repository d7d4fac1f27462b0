"""Low-rank adapters (LoRA) on the decoder's projections, one or one per role, over a frozen base.

A targeted projection W [in, out] gains, per adapter n, a pair A_n [in, r] and B_n [r, out]; its
output becomes x W + (alpha / r) x A_n B_n for the adapter n its token selects. B starts at zero,
so a model with fresh adapters computes exactly what its base computes.

Why our own einsum adapter rather than flax.nnx's `LoRA` / `LoRAParam` (or qwix, not installed):
- per-token selection: MATPO's packed rows mix planner and worker tokens, and the decode batch
  mixes planner and worker slots. Here every adapter's A is applied to every token (r columns
  each, cheap), the r-dimensional result is multiplied by a one-hot role selector, and B
  contracts over (adapter, rank): one program, no gather of per-token weight matrices, and a
  token's unselected adapters get exactly zero gradient. nnx.LoRA holds one adapter.
- the frozen split: `nnx.LoRAParam` subclasses `nnx.Param`, so the `nnx.Param` filter the code
  uses for trainable state would catch base and adapters alike. `LoRAWeight` is its own Variable
  type: `nnx.split(model, LoRAWeight, ...)` gives the adapters as the trained state and leaves
  every base parameter in the frozen rest, with no gradient and no optimizer state.
- the base keeps its projection (projection.Linear, hand-written backward) untouched.

Roles: `roles="shared"` has one adapter that every role uses; `"per_role"` has one per role id
(trajectory.ROLE_IDS: 0 planner/single agent, 1 worker). A role id of `ADAPTERS_OFF` (-1) selects
no adapter: the base itself, which is the KL reference policy of a LoRA run (same program, same
parameter tree, no copy).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

ROLE_MODES = ("shared", "per_role")
# Projections an adapter may target (HF names; the decoder's attention and MLP projections).
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ROLE_NAMES = ("planner", "worker")  # index = role id (agents.trajectory.ROLE_IDS)
ADAPTERS_OFF = -1  # a role id that selects no adapter: the frozen base
BASE_DTYPES = ("float32", "bfloat16")  # what the frozen base may be stored in


class LoRAConfigError(ValueError):
    """A LoRA setting out of range; the message names the model.lora field."""


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    """model.lora's fields (config/sections.LoRASection), without the on/off switch (rank 0)."""

    rank: int
    alpha: float
    targets: tuple[str, ...] = TARGETS
    roles: str = "shared"
    base_dtype: str | None = None  # the frozen base's storage dtype (None: as built)

    def __post_init__(self):
        if self.rank < 1:
            raise LoRAConfigError(f"model.lora.rank={self.rank}: must be >= 1 with adapters on")
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown or not self.targets:
            raise LoRAConfigError(f"model.lora.targets={self.targets}: each must be one of "
                                  f"{TARGETS} (and at least one)")
        if self.roles not in ROLE_MODES:
            raise LoRAConfigError(f"model.lora.roles={self.roles!r}: expected one of {ROLE_MODES}")
        if self.base_dtype is not None and self.base_dtype not in BASE_DTYPES:
            raise LoRAConfigError(f"model.lora.base_dtype={self.base_dtype!r}: expected one of "
                                  f"{BASE_DTYPES} (or None: the model's param_dtype)")

    @property
    def num_adapters(self) -> int:
        return len(ROLE_NAMES) if self.roles == "per_role" else 1

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @property
    def role_adapters(self) -> tuple[int, ...]:
        """Role id -> adapter index."""
        return tuple(range(len(ROLE_NAMES))) if self.roles == "per_role" else (0,) * len(ROLE_NAMES)

    def adapter_names(self) -> tuple[str, ...]:
        return ROLE_NAMES if self.roles == "per_role" else ("default",)


class LoRAWeight(nnx.Variable):
    """An adapter matrix: the trained state of a LoRA run (not an nnx.Param; see above)."""


def add_adapters(model, lora: LoRAConfig, seed: int = 0):
    """Gives every targeted projection of `model` (a CausalLM) `lora.num_adapters` adapters, in
    place: A ~ N(0, 1/in) (each adapter its own draw), B = 0; with `lora.base_dtype`, stores the
    base's parameters in that dtype (the adapters stay in param_dtype). Returns the model."""
    config = model.config
    keys = iter(jax.random.split(jax.random.key(seed), len(TARGETS) * len(model.layers)))
    param_dtype = jnp.dtype(config.param_dtype)
    for layer in model.layers:
        for owner in (layer.self_attn, layer.mlp):
            for name in lora.targets:
                linear = getattr(owner, name, None)
                if linear is None:
                    continue
                fan_in, fan_out = linear.kernel[...].shape
                a = jax.random.normal(next(keys), (lora.num_adapters, fan_in, lora.rank),
                                      jnp.float32) / jnp.sqrt(jnp.float32(fan_in))
                linear.lora_a = LoRAWeight(a.astype(param_dtype))
                linear.lora_b = LoRAWeight(jnp.zeros((lora.num_adapters, lora.rank, fan_out),
                                                     param_dtype))
    if lora.base_dtype:
        # The base is frozen, so it needs no float32 master copy: the forward casts every
        # parameter to the compute dtype at use, so with compute in base_dtype the logits are
        # the same bits, at half a float32 base's memory.
        base_dtype = jnp.dtype(lora.base_dtype)
        nnx.update(model, jax.tree.map(
            lambda x: x.astype(base_dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x,
            nnx.state(model, nnx.Param)))
    model.lora = lora
    return model


def lora_of(model) -> LoRAConfig | None:
    """The model's LoRAConfig, or None for a model without adapters."""
    return getattr(model, "lora", None)


def has_adapters(model) -> bool:
    return lora_of(model) is not None


def trainable_filter(model):
    """What a train state trains: the adapters when the model has them, else every nnx.Param."""
    return LoRAWeight if has_adapters(model) else nnx.Param


def split_trainable(model):
    """(graphdef, trained state, frozen rest): with adapters, the base parameters are frozen."""
    return nnx.split(model, trainable_filter(model), ...)


def role_selector(model, roles, shape, dtype):
    """The adapter selector [*shape, num_adapters] in `dtype` (one-hot times alpha / r) for role
    ids `roles` (broadcastable to `shape`; None: role 0 everywhere), or None for a model without
    adapters. A role id of ADAPTERS_OFF gives an all-zero row (the base)."""
    lora = lora_of(model)
    if lora is None:
        return None
    if roles is None:
        roles = jnp.zeros(shape, jnp.int32)
    roles = jnp.broadcast_to(jnp.asarray(roles, jnp.int32), shape)
    table = jnp.asarray(lora.role_adapters, jnp.int32)
    adapter = jnp.where(roles >= 0, table[jnp.clip(roles, 0, len(ROLE_NAMES) - 1)], -1)
    # The scale alpha / r rides on the selector: -1 (no adapter) -> an all-zero row.
    return jax.nn.one_hot(adapter, lora.num_adapters, dtype=dtype) * jnp.asarray(lora.scale, dtype)


def project(linear, x, select):
    """linear(x) plus its selected adapter's scaled low-rank update (nothing without adapters)."""
    out = linear(x)
    if select is None or not hasattr(linear, "lora_a"):
        return out
    a = linear.lora_a[...].astype(x.dtype)  # [n, in, r]
    b = linear.lora_b[...].astype(x.dtype)  # [n, r, out]
    # Every adapter's down-projection (n * r columns), masked to the token's own adapter; B then
    # contracts over (adapter, rank), so an unselected adapter adds exact zeros.
    down = jnp.einsum("...i,nir->...nr", x, a) * select[..., None]
    up = jnp.einsum("...nr,nro->...o", down, b)
    return out + up.astype(out.dtype)
