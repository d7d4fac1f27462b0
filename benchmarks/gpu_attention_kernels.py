"""Attention kernels on one GPU, `xla` vs the kernels side by side in one run (issue 51).

Prepared for a lent H100/H200 (under 10 minutes there); NOT YET RUN ON A GPU: no figure from it
is committed. Random weights with the Qwen3-0.6B and Qwen3-4B shapes, bfloat16. Per model:
  1. training attention alone, forward+backward, packed rows of T tokens (several sequences
     continuing shared prompts, as the trainer packs them): per model.attention.train choice
     (xla, cudnn, pallas_gpu), ms and attention TFLOP/s;
  2. a whole forward+backward of the model on those rows (grad of a token cross-entropy w.r.t.
     every parameter; no optimizer update): tokens/s and model FLOPs utilisation against the
     chip's bf16 dense peak;
  3. decode steps at batch 64 over a cache filled to several fills: the dense cache of max_len
     slots (xla), and a paged cache (rollout.kv_cache=paged, 64-token pages, a pool of the
     filled pages) read by xla's gather and by the Pallas paged kernel (paged_gpu); ms per step
     against the HBM-bandwidth floor of reading the weights once plus the filled KV cache.
     max_len is the largest power of two whose dense cache fits 70% of the GPU's memory beside
     the weights (batch 64 x 16,384 tokens of Qwen3-4B alone would be 155 GB), at most 16,384;
     the fills are a sixteenth, a quarter and all of it.
Every row names what actually ran (`ran`: a kernel that cannot express a rule falls back, e.g.
pallas_gpu with shared prompts runs xla, and the note says so). Output: one JSON on stdout and
benchmarks/results/gpu_attention_kernels_<device>.json.

    pip install -e .[cuda]
    python benchmarks/gpu_attention_kernels.py            # on the GPU
    python benchmarks/gpu_attention_kernels.py --smoke    # any machine: tiny shapes, writes nothing
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from matpo_jax.model import CausalLM, DecoderConfig, init_cache, paged_cache
from matpo_jax.model import attention_dispatch
from matpo_jax.model.attention_dispatch import plan_train_attention, train_attention

RESULTS = Path(__file__).parent / "results"
KERNELS = ("xla", "cudnn", "pallas_gpu")

QWEN3 = {  # Hugging Face config.json dimensions; weights random
    "qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, tie_word_embeddings=True),
    "qwen3-4b": dict(vocab_size=151936, hidden_size=2560, intermediate_size=9728,
                     num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, tie_word_embeddings=True),
}
SMOKE = {"tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      tie_word_embeddings=True)}

# Dense bf16 peak FLOP/s and HBM bytes/s by device kind (the vendors' datasheets, SXM parts).
CHIPS = {"H100": (989e12, 3.35e12), "H200": (989e12, 4.8e12)}


def chip_figures():
    kind = jax.devices()[0].device_kind
    for name, figures in CHIPS.items():
        if name in kind:
            return kind, figures
    return kind, (None, None)


def packed_ids(rows: int, length: int):
    """Segment and shared-prompt ids: each row holds prompts of length/8, each continued by
    three sequences of length/8 (the trainer's share_prompts packing), then padding."""
    span = length // 8
    seg, pre = np.zeros((rows, length), np.int32), np.zeros((rows, length), np.int32)
    for row in range(rows):
        segment, start = 0, 0
        while start + 4 * span <= length:
            segment += 1
            prompt = segment
            seg[row, start:start + span] = prompt
            for i in range(1, 4):
                segment += 1
                seg[row, start + i * span:start + (i + 1) * span] = segment
                pre[row, start + i * span:start + (i + 1) * span] = prompt
            start += 4 * span
    return jnp.asarray(seg), jnp.asarray(pre)


def timed(fn, args, repeats):
    """Median seconds of fn(*args) after one compiling call."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def ran(kernel: str, has_prefix: bool) -> dict:
    plan = plan_train_attention(kernel, has_prefix)
    return {"asked": kernel, "ran": plan.implementation, "interpret": plan.interpret,
            "note": plan.note}


def attention_rows(config: DecoderConfig, rows, length, repeats):
    """Training attention fwd+bwd per kernel, with and without shared prompts."""
    keys = jax.random.split(jax.random.key(0), 4)
    heads, kv, dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    q = jax.random.normal(keys[0], (rows, length, heads, dim), jnp.bfloat16)
    k = jax.random.normal(keys[1], (rows, length, kv, dim), jnp.bfloat16)
    v = jax.random.normal(keys[2], (rows, length, kv, dim), jnp.bfloat16)
    segments, prefixes = packed_ids(rows, length)
    # causal fwd (2 matmuls) + bwd (5) over about half the [T, T] scores; packing skips more
    flops = 7 * 2 * rows * heads * length * length * dim / 2
    out = []
    for with_prompts in (False, True):
        prefix = prefixes if with_prompts else None
        for kernel in KERNELS:
            def step(q, k, v, kernel=kernel, prefix=prefix):
                def loss(q, k, v):
                    o = train_attention(q, k, v, segments, prefix, kernel)
                    return jnp.sum(o.astype(jnp.float32) ** 2)
                return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
            row = ran(kernel, with_prompts)
            try:
                seconds = timed(jax.jit(step), (q, k, v), repeats)
                row.update(ms=round(1e3 * seconds, 3),
                           causal_tflops_per_s=round(flops / seconds / 1e12, 2))
            except Exception as err:  # a kernel refusing this shape is a result, not a crash
                row.update(error=f"{type(err).__name__}: {str(err)[:300]}")
            out.append({"shared_prompts": with_prompts, **row})
    return out


def train_rows(config: DecoderConfig, rows, length, repeats, peak):
    """A whole model forward+backward per kernel (shared prompts on, as the RL trainer packs)."""
    tokens = jax.random.randint(jax.random.key(1), (rows, length), 0, config.vocab_size)
    segments, prefixes = packed_ids(rows, length)
    out = []
    for kernel in KERNELS:
        model = CausalLM(config.replace(attention_train=kernel), rngs=nnx.Rngs(0))
        graphdef, params = nnx.split(model)
        n_params = sum(x.size for x in jax.tree.leaves(params))

        def loss(params, tokens):
            hidden = nnx.merge(graphdef, params).hidden_states(
                tokens, segment_ids=segments, prefix_ids=prefixes, remat="full")
            logits = nnx.merge(graphdef, params).logits_from_hidden(hidden[:, :-1])
            logp = jax.nn.log_softmax(logits)
            return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

        row = ran(kernel, True)
        try:
            seconds = timed(jax.jit(jax.grad(loss)), (params, tokens), repeats)
            token_count = rows * length
            model_flops = 6 * n_params * token_count + 3 * 2 * 2 * config.num_hidden_layers * (
                config.num_attention_heads * config.head_dim) * rows * length * length / 2
            row.update(ms=round(1e3 * seconds, 2), tokens_per_s=round(token_count / seconds),
                       mfu=None if peak is None else round(model_flops / seconds / peak, 4))
        except Exception as err:
            row.update(error=f"{type(err).__name__}: {str(err)[:300]}")
        out.append(row)
        del model, params
    return out


PAGE_SIZE = 64
# (cache, model.attention.decode) per decode row: the dense cache, then a paged one two ways.
DECODE_VARIANTS = (("dense", "xla"), ("paged", "xla"), ("paged", "paged_gpu"))


def filled_cache(config: DecoderConfig, kind: str, batch: int, max_len: int, fill: int):
    """A cache whose rows hold `fill` tokens (zeros): dense, or paged with a pool of just the
    pages they fill plus the next token's."""
    if kind == "dense":
        return init_cache(config, batch, max_len)._replace(
            lengths=jnp.full((batch,), fill, jnp.int32))
    pages = batch * (fill // PAGE_SIZE + 1)
    cache = paged_cache.init_paged_cache(config.num_hidden_layers, config.num_key_value_heads,
                                         config.head_dim, batch, max_len, pages, PAGE_SIZE,
                                         config.dtype)
    lengths = jnp.full((batch,), fill, jnp.int32)
    return paged_cache.advance(paged_cache.reserve(cache, lengths + 1), lengths)


def decode_rows(config: DecoderConfig, batch, max_len, fills, repeats, bandwidth):
    """Decode step ms at several cache fills vs the HBM floor (weights + filled KV, read once),
    per DECODE_VARIANTS entry."""
    tokens = jnp.zeros((batch,), jnp.int32)
    active = jnp.ones((batch,), bool)
    itemsize = jnp.dtype(config.dtype).itemsize
    out = []
    for kind, choice in DECODE_VARIANTS:
        model = CausalLM(dataclasses.replace(config, attention_decode=choice), rngs=nnx.Rngs(0))
        graphdef, params = nnx.split(model)
        del model
        weight_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
        step = jax.jit(lambda params, tokens, cache, active, graphdef=graphdef: nnx.merge(
            graphdef, params).decode(tokens, cache, active), donate_argnums=2)
        ran = "?"
        for fill in fills:
            cache = filled_cache(config, kind, batch, max_len, fill)
            with attention_dispatch.record() as uses:
                _, cache = step(params, tokens, cache, active)  # compiles (unless same shapes)
            ran = attention_dispatch.implementations(uses).get("decode", ran)
            times = []
            for _ in range(repeats):
                cache = cache._replace(lengths=jnp.full((batch,), fill, jnp.int32))
                start = time.perf_counter()
                _, cache = step(params, tokens, cache, active)
                jax.block_until_ready(cache.lengths)
                times.append(time.perf_counter() - start)
            kv_bytes = 2 * config.num_hidden_layers * batch * fill * \
                config.num_key_value_heads * config.head_dim * itemsize
            seconds = float(np.median(times))
            floor = None if bandwidth is None else (weight_bytes + kv_bytes) / bandwidth
            out.append({"cache": kind, "asked": choice,
                        "ran": ran,
                        "batch": batch, "max_len": max_len, "fill": fill,
                        "ms": round(1e3 * seconds, 3),
                        "hbm_floor_ms": None if floor is None else round(1e3 * floor, 3),
                        "of_floor": None if floor is None else round(floor / seconds, 3)})
        del params
    return out


def decode_shape(config: DecoderConfig, batch: int, limit: int = 16384) -> dict:
    """batch, max_len and fills of the decode rows on this device (see the header)."""
    stats = jax.devices()[0].memory_stats() or {}
    memory = stats.get("bytes_limit")
    itemsize = jnp.dtype(config.dtype).itemsize
    weights = itemsize * (config.vocab_size * config.hidden_size * (
        1 if config.tie_word_embeddings else 2) + config.num_hidden_layers * (
        config.hidden_size * config.head_dim * (2 * config.num_attention_heads
                                                 + 2 * config.num_key_value_heads)
        + 3 * config.hidden_size * config.intermediate_size))
    per_token = 2 * config.num_hidden_layers * batch * config.num_key_value_heads * \
        config.head_dim * itemsize
    max_len = limit
    while memory and max_len > 256 and weights + per_token * (max_len + PAGE_SIZE) > 0.7 * memory:
        max_len //= 2
    # A page past the largest fill holds the step's new token.
    return dict(batch=batch, max_len=max_len + PAGE_SIZE,
                fills=(max_len // 16, max_len // 4, max_len))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, any backend, no file")
    args = parser.parse_args()
    kind, (peak, bandwidth) = chip_figures()
    if args.smoke:
        models, rows, length, repeats = SMOKE, 1, 256, 1
        # max_len leaves a page past the largest fill for the step's new token.
        decode = dict(batch=4, max_len=320, fills=(64, 256))
    else:
        models, rows, length, repeats = QWEN3, 2, 8192, 5
        decode = None  # per model: decode_shape
    report = {"device": kind, "backend": jax.default_backend(), "jax": jax.__version__,
              "host": platform.node(), "peak_bf16_flops": peak, "hbm_bytes_per_s": bandwidth,
              "rows": rows, "row_length": length, "models": {}}
    for name, dims in models.items():
        config = DecoderConfig(**dims, dtype="bfloat16", param_dtype="bfloat16")
        started = time.perf_counter()
        report["models"][name] = {
            "attention_fwd_bwd": attention_rows(config, rows, length, repeats),
            "train_fwd_bwd": train_rows(config, rows, length, repeats, peak),
            "decode": decode_rows(config, repeats=repeats, bandwidth=bandwidth,
                                  **(decode or decode_shape(config, batch=64))),
            "seconds": round(time.perf_counter() - started, 1)}
    print(json.dumps(report, indent=1))
    if not args.smoke:
        RESULTS.mkdir(exist_ok=True)
        safe = "".join(c if c.isalnum() else "_" for c in kind)
        (RESULTS / f"gpu_attention_kernels_{safe}.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
