"""The decoder of the Qwen3, Llama and Qwen2 families in flax.nnx (one module, the family's switches
in DecoderConfig): packed-sequence training forward and an explicit KV cache.

Parameter names mirror Hugging Face's (`layers/0/self_attn/q_proj/kernel` <-> `model.layers.0.
self_attn.q_proj.weight`) so checkpoint conversion and partition rules stay one regex each.
The cache is a plain pytree passed in and returned, so it flows through jit and lax.while_loop.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from matpo_jax.model import attention_dispatch
from matpo_jax.model import paged_cache
from matpo_jax.model.cached_attention import (  # noqa: F401  (re-exported)
    blocked_cached_attention, cached_attention)
from matpo_jax.model import lora as lora_lib
from matpo_jax.model import projection
from matpo_jax.model.remat import remat_policy
from matpo_jax.model.config import DecoderConfig
from matpo_jax.model.packed_attention import grouped_attention, packed_attention  # noqa: F401


class KVCache(NamedTuple):
    """Per-layer, heads-major cache: k[i] is layer i's keys [batch, kv_heads, head_dim, max_len]
    (slot-minor), v[i] its values [batch, kv_heads, max_len, head_dim].

    One array per layer (not one stacked [layers, ...] buffer) so that a step scatters its new
    keys into each layer's array in place, and heads-major so that attention reads the cache as
    it lies (batch and kv heads are batch dimensions), with no transpose. Keys slot-minor: a
    decode step's scores then sum whole rows of slots (see cached_attention)."""

    k: tuple  # per layer: [batch, kv_heads, head_dim, max_len]
    v: tuple  # per layer: [batch, kv_heads, max_len, head_dim]
    lengths: jax.Array  # [batch] int32: tokens written per row = next write position

    @property
    def max_len(self) -> int:
        return self.v[0].shape[2]

    def rows(self, index) -> "KVCache":
        """The sub-cache of rows `index` (an int array [L]; a gather of every layer)."""
        return KVCache(tuple(k[index] for k in self.k), tuple(v[index] for v in self.v),
                       self.lengths[index])

    def set_rows(self, index, sub: "KVCache") -> "KVCache":
        """Writes sub-cache `sub` back into rows `index`; out-of-range indices are dropped."""
        return KVCache(tuple(k.at[index].set(s, mode="drop") for k, s in zip(self.k, sub.k)),
                       tuple(v.at[index].set(s, mode="drop") for v, s in zip(self.v, sub.v)),
                       self.lengths.at[index].set(sub.lengths, mode="drop"))


def init_cache(config: DecoderConfig, batch: int, max_len: int, dtype=None) -> KVCache:
    """An empty cache; `dtype` defaults to the model's compute dtype."""
    dtype = jnp.dtype(dtype or config.dtype)
    shape = (batch, config.num_key_value_heads, max_len, config.head_dim)
    key_shape = (batch, config.num_key_value_heads, config.head_dim, max_len)
    layers = range(config.num_hidden_layers)
    return KVCache(k=tuple(jnp.zeros(key_shape, dtype) for _ in layers),
                   v=tuple(jnp.zeros(shape, dtype) for _ in layers),
                   lengths=jnp.zeros((batch,), jnp.int32))


# ----------------------------------------------------------------------------- building blocks


class RMSNorm(nnx.Module):
    """Normalises in float32 and scales in the compute dtype, as Hugging Face's Qwen3RMSNorm."""

    def __init__(self, dim: int, eps: float, dtype, param_dtype):
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype))
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.scale[...].astype(self.dtype) * normed.astype(self.dtype)


def rope_frequencies(config: DecoderConfig) -> jax.Array:
    """The rotary inverse frequencies [head_dim/2], with the config's scaling applied."""
    head_dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta
                      ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    if config.rope_type == "linear":
        return inv_freq / config.rope_factor
    if config.rope_type == "llama3":
        # Wavelengths longer than the original context / low_freq_factor are stretched by
        # `factor`, those shorter than context / high_freq_factor kept, the band between blended.
        wavelength = 2 * jnp.pi / inv_freq
        context = config.rope_original_max_positions
        low, high = config.rope_low_freq_factor, config.rope_high_freq_factor
        blend = (context / wavelength - low) / (high - low)
        blended = (1 - blend) * inv_freq / config.rope_factor + blend * inv_freq
        return jnp.where(wavelength > context / low, inv_freq / config.rope_factor,
                         jnp.where(wavelength < context / high, inv_freq, blended))
    return inv_freq


def rope_tables(positions: jax.Array, inv_freq: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos/sin [B, T, head_dim/2] for integer positions [B, T]; computed once per forward."""
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotates x [B, T, heads, head_dim] with HF's rotate_half layout (halves, not interleaved)."""
    x32 = x.astype(jnp.float32)
    first, second = jnp.split(x32, 2, axis=-1)
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    rotated = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
    return rotated.astype(x.dtype)


def _linear(in_features, out_features, config: DecoderConfig, rngs: nnx.Rngs,
            use_bias: bool = False) -> nnx.Linear:
    # nnx.Linear with a backward pass that XLA:CPU compiles well (see projection.py).
    return projection.Linear(
        in_features, out_features, use_bias=use_bias, dtype=jnp.dtype(config.dtype),
        param_dtype=jnp.dtype(config.param_dtype),
        kernel_init=nnx.initializers.normal(config.initializer_range), rngs=rngs)


def _norm(dim: int, config: DecoderConfig) -> RMSNorm:
    return RMSNorm(dim, config.rms_norm_eps, jnp.dtype(config.dtype), jnp.dtype(config.param_dtype))


class Attention(nnx.Module):
    def __init__(self, config: DecoderConfig, rngs: nnx.Rngs):
        hidden, head_dim = config.hidden_size, config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = head_dim
        bias = config.qkv_bias
        self.q_proj = _linear(hidden, self.num_heads * head_dim, config, rngs, bias)
        self.k_proj = _linear(hidden, self.num_kv_heads * head_dim, config, rngs, bias)
        self.v_proj = _linear(hidden, self.num_kv_heads * head_dim, config, rngs, bias)
        self.o_proj = _linear(self.num_heads * head_dim, hidden, config, rngs)
        if config.qk_norm:
            self.q_norm = _norm(head_dim, config)
            self.k_norm = _norm(head_dim, config)
        self.qk_norm = config.qk_norm
        # model.attention.<path>: which implementation each path runs (attention_dispatch).
        self.attention_train = config.attention_train
        self.attention_extend = config.attention_extend
        self.attention_decode = config.attention_decode

    def __call__(self, x, rope, mask, layer_cache=None, write_slots=None, select=None):
        """Attends x [B, T, hidden]; `select`: the LoRA adapter selector (model/lora.py; None:
        the base projections alone). Without a cache, `mask` is the packed rows' segment ids
        [B, T] int (causal within a segment, 0 = padding; see packed_attention), or the pair
        (segment ids, shared-prefix ids) of rows whose sequences share prompts. With
        `layer_cache` = (k [B, K, D, S], v [B, K, S, D]) (heads-major), `mask` is a [B, T, S]
        bool (True = may attend; dense attention over the whole cache, for one-token decode
        steps) or a tuple (positions [B, T], lengths [B]) for `blocked_cached_attention`
        (multi-token extends); the new keys and values are first scattered into slots
        `write_slots` [B, T] (out of range = dropped) and the updated (k, v) is returned
        alongside. With a paged cache, `layer_cache` is the layer's (k, v) pages and `mask` a
        `paged_cache.PagedView` (the pages are written, then attended)."""
        batch, length, _ = x.shape
        q = lora_lib.project(self.q_proj, x, select).reshape(batch, length, self.num_heads,
                                                             self.head_dim)
        k = lora_lib.project(self.k_proj, x, select).reshape(batch, length, self.num_kv_heads,
                                                             self.head_dim)
        v = lora_lib.project(self.v_proj, x, select).reshape(batch, length, self.num_kv_heads,
                                                             self.head_dim)
        cos, sin = rope
        if self.qk_norm:  # Qwen3 normalises each head before the rotation
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if isinstance(mask, paged_cache.PagedView):  # a paged cache: write the pages, attend
            k, v = paged_cache.write(*layer_cache, mask.page_table, mask.positions, k, v,
                                     mask.num_valid)
            out = attention_dispatch.paged_attention(q, k, v, mask, self.attention_extend,
                                                     self.attention_decode)
            return lora_lib.project(self.o_proj, out, select), (k, v)
        if layer_cache is not None:
            k_cache, v_cache = layer_cache
            rows = jnp.arange(batch)[:, None, None]
            heads = jnp.arange(self.num_kv_heads)[None, :, None]
            slots = write_slots[:, None, :]
            # [B, T, K, D] -> [B, K, T, D]: a transpose of the new tokens only, never the cache
            # (the key cache's slot axis is last; the indexed [B, K, T] dims come first).
            k = k_cache.at[rows, heads, :, slots].set(
                k.transpose(0, 2, 1, 3).astype(k_cache.dtype), mode="drop")
            v = v_cache.at[rows, heads, slots].set(
                v.transpose(0, 2, 1, 3).astype(v_cache.dtype), mode="drop")
            layer_cache = (k, v)
            if isinstance(mask, tuple):  # (positions, lengths): a multi-token extend
                out = attention_dispatch.extend_attention(q, k, v, *mask, self.attention_extend)
            else:
                out = attention_dispatch.decode_attention(q, k, v, mask, self.attention_decode)
        else:  # packed rows: segment ids, or (segment ids, shared-prefix ids)
            segment_ids, prefix_ids = mask if isinstance(mask, tuple) else (mask, None)
            out = attention_dispatch.train_attention(q, k, v, segment_ids, prefix_ids,
                                                     self.attention_train)
        return lora_lib.project(self.o_proj, out, select), layer_cache


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: DecoderConfig, rngs: nnx.Rngs):
        self.gate_proj = _linear(config.hidden_size, config.intermediate_size, config, rngs)
        self.up_proj = _linear(config.hidden_size, config.intermediate_size, config, rngs)
        self.down_proj = _linear(config.intermediate_size, config.hidden_size, config, rngs)

    def __call__(self, x, select=None):
        hidden = projection.swiglu(lora_lib.project(self.gate_proj, x, select),
                                   lora_lib.project(self.up_proj, x, select))
        return lora_lib.project(self.down_proj, hidden, select)


class DecoderLayer(nnx.Module):
    def __init__(self, config: DecoderConfig, rngs: nnx.Rngs):
        self.input_layernorm = _norm(config.hidden_size, config)
        self.self_attn = Attention(config, rngs)
        self.post_attention_layernorm = _norm(config.hidden_size, config)
        self.mlp = MLP(config, rngs)

    def __call__(self, x, rope, mask, layer_cache=None, write_slots=None, select=None):
        attn_out, layer_cache = self.self_attn(self.input_layernorm(x), rope, mask,
                                               layer_cache, write_slots, select)
        x = x + attn_out
        x = x + self.mlp(self.post_attention_layernorm(x), select)
        return x, layer_cache


# ----------------------------------------------------------------------------- the model


class CausalLM(nnx.Module):
    def __init__(self, config: DecoderConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.embed_tokens = nnx.Embed(
            config.vocab_size, config.hidden_size, dtype=jnp.dtype(config.dtype),
            param_dtype=jnp.dtype(config.param_dtype),
            embedding_init=nnx.initializers.normal(config.initializer_range), rngs=rngs)
        self.layers = nnx.List(
            [DecoderLayer(config, rngs) for _ in range(config.num_hidden_layers)])
        self.norm = _norm(config.hidden_size, config)
        if not config.tie_word_embeddings:
            self.lm_head = _linear(config.hidden_size, config.vocab_size, config, rngs)

    # --- training / scoring forward

    def __call__(self, tokens, positions=None, segment_ids=None, prefix_ids=None, roles=None):
        """Logits [B, T, V] float32 for packed rows: attention is causal within equal segment ids
        (and reaches the shared prefix segment `prefix_ids` names, 0 = none); segment 0 marks
        padding. Positions default to 0..T-1 (restart them per packed segment). `roles` [B, T]:
        each token's role id, which picks its LoRA adapter (model/lora.py; None: role 0;
        lora.ADAPTERS_OFF: the base); ignored by a model without adapters."""
        return self.logits_from_hidden(self.hidden_states(tokens, positions, segment_ids,
                                                          prefix_ids=prefix_ids, roles=roles))

    def hidden_states(self, tokens, positions=None, segment_ids=None, remat: str = "none",
                      scan_layers: bool = False, prefix_ids=None, roles=None):
        """The final normalised hidden states [B, T, hidden] of __call__, for callers that project
        to the vocabulary in chunks (the full [B, T, V] float32 logits can dominate memory).

        `remat` names the rematerialisation policy of each decoder layer under differentiation
        (model.remat.REMAT_POLICIES; "none": every intermediate is kept for the backward).
        `scan_layers` runs the layers as one `lax.scan` over their stacked parameters (cast to
        the compute dtype first): the compiler then sees one layer instead of all of them, which
        is what keeps compiling a 40-layer model at 40k tokens in minutes; it costs a stacked
        copy of the layer parameters while the step runs. Same numbers either way."""
        batch, length = tokens.shape
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
        if segment_ids is None:
            segment_ids = jnp.ones((batch, length), jnp.int32)
        mask = segment_ids.astype(jnp.int32)
        if prefix_ids is not None:
            mask = (mask, prefix_ids.astype(jnp.int32))
        hidden = self.embed_tokens(tokens)
        rope = rope_tables(positions, rope_frequencies(self.config))
        select = lora_lib.role_selector(self, roles, (batch, length), hidden.dtype)
        layer_def = nnx.graphdef(self.layers[0])

        def apply(layer_state, hidden):
            return nnx.merge(layer_def, layer_state)(hidden, rope, mask, None, None, select)[0]

        if remat != "none":
            apply = jax.checkpoint(apply, policy=remat_policy(remat), prevent_cse=not scan_layers)
        states = [nnx.state(layer) for layer in self.layers]
        if not scan_layers:
            for state in states:
                hidden = apply(state, hidden)
        else:
            compute = jnp.dtype(self.config.dtype)
            stacked = jax.tree.map(
                lambda *xs: jnp.stack([x.astype(compute) if jnp.issubdtype(x.dtype, jnp.floating)
                                       else x for x in xs]), *states)
            hidden, _ = jax.lax.scan(lambda h, state: (apply(state, h), None), hidden, stacked)
        return self.norm(hidden)

    # --- cached generation

    def extend(self, tokens, num_valid, cache: KVCache, roles=None):
        """Appends tokens[b, :num_valid[b]] to row b at positions cache.lengths[b] + t.

        Returns logits [B, T, V] (rows past num_valid are meaningless) and the new cache. Rows with
        num_valid 0 are untouched; writes past max_len are dropped, so lengths can exceed max_len
        (callers detect overflow with cache.lengths > cache.max_len). roles [B]: each row's role
        id (its LoRA adapter; see __call__)."""
        hidden, cache = self.extend_hidden(tokens, num_valid, cache, roles)
        return self.logits_from_hidden(hidden), cache

    def extend_last(self, tokens, num_valid, cache: KVCache, roles=None):
        """`extend` that projects only each row's last written position to the vocabulary:
        logits [B, V] at index num_valid[b] - 1 (meaningless for rows with num_valid 0). A sampler
        needs no more, and it skips the [B, T, V] logits of a long injection."""
        hidden, cache = self.extend_hidden(tokens, num_valid, cache, roles)
        last = jnp.clip(num_valid.astype(jnp.int32) - 1, 0, tokens.shape[1] - 1)
        hidden = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]
        return self.logits_from_hidden(hidden), cache

    def extend_hidden(self, tokens, num_valid, cache, roles=None):
        """`extend` before the output projection: (normalised hidden [B, T, hidden], cache).
        `cache` is a dense KVCache or a paged_cache.PagedKVCache (pages reserved for the new
        tokens first; a row that cannot get them sets the cache's `overflow`)."""
        batch, length = tokens.shape
        num_valid = num_valid.astype(jnp.int32)
        offsets = jnp.arange(length, dtype=jnp.int32)[None, :]
        positions = cache.lengths[:, None] + offsets
        new_lengths = cache.lengths + num_valid
        if isinstance(cache, paged_cache.PagedKVCache):
            cache = paged_cache.reserve(cache, new_lengths)
            view = paged_cache.PagedView(cache.page_table, positions, new_lengths, num_valid)
            hidden, layers = self._layers(tokens, positions, view, cache, roles)
            return self.norm(hidden), paged_cache.advance(
                cache._replace(k=tuple(k for k, _ in layers), v=tuple(v for _, v in layers)),
                new_lengths)
        # Padding tokens target slot max_len, which mode="drop" discards.
        write_slots = jnp.where(offsets < num_valid[:, None], positions, cache.max_len)
        if length == 1:  # decode: dense attention over the cache is cheapest
            slots = jnp.arange(cache.max_len, dtype=jnp.int32)[None, None, :]
            mask = (slots <= positions[:, :, None]) & (slots < new_lengths[:, None, None])
        else:  # longer extends only read the filled part of the cache (blocked, online softmax)
            mask = (positions, new_lengths)

        hidden, layers = self._layers(tokens, positions, mask, cache, roles, write_slots)
        return self.norm(hidden), KVCache(tuple(k for k, _ in layers),
                                          tuple(v for _, v in layers), new_lengths)

    def _layers(self, tokens, positions, mask, cache, roles, write_slots=None):
        """Runs every layer over the new tokens: (hidden, [(k, v) per layer])."""
        batch, length = tokens.shape
        hidden = self.embed_tokens(tokens)
        rope = rope_tables(positions, rope_frequencies(self.config))
        select = lora_lib.role_selector(
            self, None if roles is None else jnp.asarray(roles)[:, None], (batch, length),
            hidden.dtype)
        layers = []
        for layer, k_layer, v_layer in zip(self.layers, cache.k, cache.v):
            hidden, kv = layer(hidden, rope, mask, (k_layer, v_layer), write_slots, select)
            layers.append(kv)
        return hidden, layers

    def prefill(self, tokens, lengths, cache: KVCache, roles=None):
        """Resets every row to length 0 and writes tokens[b, :lengths[b]]."""
        if isinstance(cache, paged_cache.PagedKVCache):  # every row's pages back first
            return self.extend(tokens, lengths, paged_cache.release(
                cache, jnp.ones_like(cache.lengths, bool)), roles)
        return self.extend(tokens, lengths, cache._replace(lengths=jnp.zeros_like(cache.lengths)),
                           roles)

    def decode(self, tokens, cache: KVCache, active, roles=None):
        """One token per active row: tokens [B], active [B] bool -> (logits [B, V], cache)."""
        return self.extend_last(tokens[:, None], active.astype(jnp.int32), cache, roles)

    # --- output projection

    def head_kernel(self, dtype=None):
        """The output projection [hidden, vocab] (the tied embedding's transpose, or lm_head), in
        `dtype` (default: the compute dtype)."""
        if self.config.tie_word_embeddings:
            head = self.embed_tokens.embedding[...].T
        else:
            head = self.lm_head.kernel[...]
        return head.astype(dtype or jnp.dtype(self.config.dtype))

    def logits_from_hidden(self, hidden):
        """[..., hidden] normalised states -> [..., V] float32 logits (tied or untied head)."""
        # float32 accumulation: log-probs for the RL ratio need it even under bfloat16 compute.
        return projection.project(hidden, self.head_kernel(hidden.dtype), jnp.float32)
