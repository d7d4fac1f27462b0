"""Next-token sampling math: temperature, top-k, top-p, greedy, and the recorded log-probability.

Everything here is pure jnp on a [B, V] batch of float32 logits, so it fuses into the decode step.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

_NEG_INF = -jnp.inf


class SamplingConfigError(ValueError):
    """A sampling setting out of range; the message names the field."""


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen. Frozen and hashable: it is a static argument of the jitted loop.

    temperature 0 or greedy=True picks the argmax (top_k/top_p are then ignored); top_k 0 and
    top_p 1.0 switch those truncations off. max_turn_tokens caps the tokens of one assistant turn.
    token_count: only ids below it are drawn (greedy too): a checkpoint's embedding has rows past
    its tokenizer's last id (Qwen3: 151,936 rows, 151,669 tokens), which decode to nothing.
    0: every row. Like top-k/top-p it truncates the draw, not the recorded log-prob.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False
    max_turn_tokens: int = 256
    token_count: int = 0

    def __post_init__(self):
        if not self.temperature >= 0.0:
            raise SamplingConfigError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise SamplingConfigError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise SamplingConfigError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if not isinstance(self.token_count, int) or self.token_count < 0:
            raise SamplingConfigError(
                f"token_count must be an integer >= 0 (0: no limit), got {self.token_count!r}")
        if not isinstance(self.max_turn_tokens, int) or self.max_turn_tokens <= 0:
            raise SamplingConfigError(
                f"max_turn_tokens must be a positive integer, got {self.max_turn_tokens!r}")

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0.0

    @property
    def logprob_temperature(self) -> float:
        """The temperature of the distribution whose log-probs are recorded (1 for greedy)."""
        return 1.0 if self.is_greedy else float(self.temperature)

    def replace(self, **changes) -> "Sampling":
        return dataclasses.replace(self, **changes)


def truncate_top_k(logits: jax.Array, k: int) -> jax.Array:
    """Keeps the k largest logits per row (ties at the k-th value are all kept), -inf elsewhere."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth_largest = jax.lax.top_k(logits, k)[0][..., -1:]
    return jnp.where(logits < kth_largest, _NEG_INF, logits)


def truncate_top_p(logits: jax.Array, p: float) -> jax.Array:
    """Nucleus truncation: keeps the smallest set of most likely tokens whose mass reaches p.

    A token is kept when the mass strictly before it (in descending order) is below p, so the
    most likely token always survives.
    """
    if p >= 1.0:
        return logits
    return _truncate_top_p_rows(logits, p)  # a scalar mass broadcasts over the rows


def drop_non_tokens(logits: jax.Array, token_count: int) -> jax.Array:
    """-inf at the ids >= token_count (rows of the embedding no token has); 0: unchanged."""
    if token_count <= 0 or token_count >= logits.shape[-1]:
        return logits
    return jnp.where(jnp.arange(logits.shape[-1]) >= token_count, _NEG_INF, logits)


def draw_keys(rng: jax.Array, streams: jax.Array, positions: jax.Array) -> jax.Array:
    """One key per row: fold_in(fold_in(rng, stream), position). A draw depends only on the
    trajectory's stream id (set by the host when a sequence takes a slot) and the cache position
    of the token it samples, never on the slot it sits in, the decode step or which other
    trajectories share the batch: a trajectory samples the same tokens wherever it runs (one
    process or several, any slot, re-prefilled elsewhere after an eviction)."""
    return jax.vmap(lambda stream, position: jax.random.fold_in(
        jax.random.fold_in(rng, stream), position))(streams, positions)


def sample_tokens(logits: jax.Array, keys: jax.Array, sampling: Sampling
                  ) -> tuple[jax.Array, jax.Array]:
    """Draws one token per row from logits [B, V] with per-row keys [B].

    Returns (tokens int32[B], logprobs float32[B]). The recorded log-prob is
    log_softmax(logits / temperature)[token]: the temperature-scaled distribution BEFORE top-k/top-p
    truncation (what the trainer recomputes from a plain forward pass; temperature 1 for greedy).
    """
    logits = logits.astype(jnp.float32)
    scaled = logits / sampling.logprob_temperature
    top = jnp.max(scaled, axis=-1, keepdims=True)
    drawable = drop_non_tokens(scaled, sampling.token_count)
    if sampling.is_greedy:
        tokens = first_index_of_max(drawable, top if drawable is scaled else None)
    else:
        truncated = truncate_top_p(truncate_top_k(drawable, sampling.top_k), sampling.top_p)
        # jax.random.categorical's Gumbel-max draw, with the fast argmax below.
        noise = jax.vmap(lambda key: jax.random.gumbel(key, truncated.shape[1:]))(keys)
        tokens = first_index_of_max(truncated + noise)
    # log_softmax at the chosen token only: the [B, V] log-probs are never materialised.
    log_total = top[:, 0] + jnp.log(jnp.sum(jnp.exp(scaled - top), axis=-1))
    chosen = jnp.take_along_axis(scaled, tokens[:, None], axis=-1)[:, 0]
    return tokens, chosen - log_total


def first_index_of_max(x: jax.Array, top: jax.Array | None = None) -> jax.Array:
    """jnp.argmax over the last axis (ties -> lowest index) as two single-output reductions.

    XLA:CPU runs argmax as one variadic (value, index) reduce in its generic loop emitter: ~0.6 ms
    for [32, 4096], a sixth of a small model's decode step. A max and a min over a masked iota
    go to the vectorised reduce kernels. `top`: the row maxima [..., 1] if already computed.
    A row without a match (NaN logits) gets the last index."""
    size = x.shape[-1]
    top = jnp.max(x, axis=-1, keepdims=True) if top is None else top
    index = jnp.min(jnp.where(x == top, jnp.arange(size, dtype=jnp.int32), size), axis=-1)
    return jnp.minimum(index, size - 1)


class ProfileValues(NamedTuple):
    """The settings of sampling profiles 0..P-1 as arrays [P]: traced operands of the jitted
    loop, so evaluation (greedy) and rollouts (sampled) of one run share one compilation."""

    temperature: jax.Array  # float32: each profile's log-prob temperature (1 for greedy)
    top_p: jax.Array  # float32
    greedy: jax.Array  # bool


@dataclass(frozen=True)
class Truncation:
    """What every profile of one decode batch shares: static, part of the compiled loop."""

    top_k: int = 0
    token_count: int = 0
    nucleus: bool = False  # some profile has top_p < 1 (the sort is compiled in)


def profile_settings(profiles: tuple[Sampling, ...]) -> tuple[ProfileValues, Truncation]:
    """(values, truncation) of profiles; they must share top_k and token_count."""
    if len({p.top_k for p in profiles}) > 1:
        raise SamplingConfigError(f"profiles differ in top_k {[p.top_k for p in profiles]}: "
                                  "one decode batch truncates to one top_k")
    if len({p.token_count for p in profiles}) > 1:
        raise SamplingConfigError(f"profiles differ in token_count "
                                  f"{[p.token_count for p in profiles]}: one vocabulary per batch")
    values = ProfileValues(
        temperature=np.asarray([p.logprob_temperature for p in profiles], np.float32),
        top_p=np.asarray([p.top_p for p in profiles], np.float32),
        greedy=np.asarray([p.is_greedy for p in profiles], bool))
    # A greedy profile's top_p counts too: evaluation at temperature 0 then compiles the same
    # loop as the rollouts it sits beside.
    truncation = Truncation(profiles[0].top_k, profiles[0].token_count,
                            nucleus=any(p.top_p < 1.0 for p in profiles))
    return values, truncation


def sample_tokens_per_row(logits: jax.Array, keys: jax.Array, profiles: tuple[Sampling, ...],
                          profile_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`sample_tokens` where row b samples with `profiles[profile_ids[b]]` (e.g. planner and
    worker slots of one decode batch, each at its role's temperature and top-p).

    The settings become per-row arrays: logits are scaled by the row's log-prob temperature,
    nucleus truncation keeps the row's own mass, greedy rows take the argmax. top_k is shared:
    every profile must have the same one. Each row's (token, log-prob) is what `sample_tokens`
    with its profile alone gives (the same key, the same arithmetic)."""
    values, truncation = profile_settings(tuple(profiles))
    return sample_with_profiles(logits, keys, values, profile_ids, truncation)


def sample_with_profiles(logits: jax.Array, keys, values: ProfileValues,
                         profile_ids: jax.Array, truncation: Truncation
                         ) -> tuple[jax.Array, jax.Array]:
    """`sample_tokens_per_row` from the profiles' values (traced or not). When every row's
    profile is greedy the draw (noise, nucleus sort) is skipped at run time. `keys`: the [B]
    keys, or a function returning them, called inside the draw only (a greedy decode step then
    never derives them: two fold-ins per row are ~3% of a small model's step on CPU)."""
    temperature = jnp.asarray(values.temperature, jnp.float32)[profile_ids][:, None]
    top_p = jnp.asarray(values.top_p, jnp.float32)[profile_ids][:, None]
    greedy = jnp.asarray(values.greedy, bool)[profile_ids]
    logits = logits.astype(jnp.float32)
    scaled = logits / temperature
    top = jnp.max(scaled, axis=-1, keepdims=True)
    drawable = drop_non_tokens(scaled, truncation.token_count)
    argmax = first_index_of_max(drawable, top if drawable is scaled else None)

    def draw(_):
        truncated = truncate_top_k(drawable, truncation.top_k)
        if truncation.nucleus:
            truncated = jnp.where(top_p < 1.0, _truncate_top_p_rows(truncated, top_p), truncated)
        row_keys = keys() if callable(keys) else keys
        noise = jax.vmap(lambda key: jax.random.gumbel(key, truncated.shape[1:]))(row_keys)
        return jnp.where(greedy, argmax, first_index_of_max(truncated + noise))

    tokens = jax.lax.cond(jnp.all(greedy), lambda _: argmax, draw, None)
    log_total = top[:, 0] + jnp.log(jnp.sum(jnp.exp(scaled - top), axis=-1))
    chosen = jnp.take_along_axis(scaled, tokens[:, None], axis=-1)[:, 0]
    return tokens, chosen - log_total


def _truncate_top_p_rows(logits: jax.Array, p: jax.Array) -> jax.Array:
    """`truncate_top_p` with one mass per row (p: [B, 1]) or one for all (a scalar)."""
    descending = -jnp.sort(-logits, axis=-1)
    probs = jax.nn.softmax(descending, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    num_kept = jnp.sum(mass_before < p, axis=-1, keepdims=True)
    threshold = jnp.take_along_axis(descending, num_kept - 1, axis=-1)
    return jnp.where(logits < threshold, _NEG_INF, logits)
