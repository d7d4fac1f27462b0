"""A decode step reading only the cache's filled prefix vs the whole cache, side by side in one run.

The model's decode step (`CausalLM.decode`, what the slot sampler calls per token) is
timed with the current attention (one fused elementwise pass over every slot of the cache,
`cached_attention._decode_attention`) and with a candidate defined below: the same pass over the
smallest of a few prefix sizes that holds every row's slots, chosen by a `lax.switch` with static
shapes. The candidate is swapped in by patching `attention_dispatch.cached_attention` before tracing, so both
use the same model, weights and cache (donated, as in the sampler's loop). Rows are filled to a
given length. Repeats of the two are interleaved; medians.

Not adopted (docs/findings.md 0o): the prefix is a static slice of the cache, which XLA:CPU
copies before its fused reduction (that fusion takes no slice as input), so the candidate pays
only where the prefix is a small part of the cache.

    python benchmarks/decode_prefix.py           # the peers' 30M model, caches 192 and 1024
    python benchmarks/decode_prefix.py --quick   # a smaller model, writes nothing
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from matpo_jax.model import CausalLM, DecoderConfig, attention_dispatch, init_cache
from matpo_jax.model.cached_attention import _decode_attention, cached_attention

RESULTS = Path(__file__).parent / "results"
# benchmarks/peers' 30M model (batch 32 is where the sampler bar of issue 20 is measured)
MODEL_30M = dict(vocab_size=4096, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                 num_attention_heads=8, num_key_value_heads=4, head_dim=64)
# configs/synthetic_tiny.py's model (the demo's), whose rollouts decode 32 slots of 1,024
MODEL_DEMO = dict(vocab_size=1024, hidden_size=128, intermediate_size=384, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32)
MODEL_QUICK = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16)


# ------------------------------------------------------------------------ candidate (not adopted)

def prefix_sizes(max_len: int, count: int = 8, quantum: int = 64) -> list[int]:
    """Multiples of a step (itself a multiple of `quantum`, at most `count` of them), the last
    being the whole cache."""
    step = -(-max_len // count)
    step = -(-step // quantum) * quantum
    return list(range(step, max_len, step)) + [max_len]


def prefix_cached_attention(q, k, v, mask):
    """`cached_attention`, decode steps reading the smallest prefix that holds every allowed
    slot (mask [B, 1, S]); multi-token calls unchanged."""
    if q.shape[1] != 1:
        return cached_attention(q, k, v, mask)
    sizes = prefix_sizes(k.shape[-1])
    slots = jnp.arange(k.shape[-1], dtype=jnp.int32)
    reach = jnp.max(jnp.where(mask, slots + 1, 0))  # one past the last slot any row attends
    index = jnp.clip(jnp.searchsorted(jnp.asarray(sizes, jnp.int32), reach), 0, len(sizes) - 1)

    def read(size):
        return lambda q, k, v, mask: _decode_attention(
            q, k[..., :size], v[:, :, :size], mask[..., :size])

    return jax.lax.switch(index, [read(size) for size in sizes], q, k, v, mask)


# ------------------------------------------------------------------------------------ timing

def decode_args(model, batch: int, max_len: int, fill: int):
    cache = init_cache(model.config, batch, max_len)
    cache = cache._replace(lengths=jnp.full((batch,), fill - 1, jnp.int32))
    return (jnp.ones((batch,), jnp.int32), cache, jnp.ones((batch,), bool))


def time_case(model, batch, max_len, fill, repeats, steps):
    """Median seconds per decode step, prefix vs whole cache (interleaved repeats)."""
    args = decode_args(model, batch, max_len, fill)
    fns = {}
    for name, use_prefix in (("prefix", True), ("whole", False)):
        graphdef, state = nnx.split(model)
        original = attention_dispatch.cached_attention
        attention_dispatch.cached_attention = prefix_cached_attention if use_prefix else original
        try:  # traced and compiled while the patch holds
            # The cache is donated, as in the sampler's loop (updated in place, not copied).
            compiled = jax.jit(lambda state, *a: nnx.merge(graphdef, state).decode(*a),
                               donate_argnums=2).lower(state, *args).compile()
        finally:
            attention_dispatch.cached_attention = original
        fns[name] = (compiled, state)
    tokens, cache, active = args
    fill_lengths = np.asarray(cache.lengths)  # host copy: the device array is donated

    def run(fn, state, cache, count):
        """`count` steps, each at the same fill (the donated cache comes back, lengths reset)."""
        for _ in range(count):
            logits, cache = fn(state, tokens, cache, active)
            cache = cache._replace(lengths=jnp.asarray(fill_lengths))
        return jax.block_until_ready(logits), cache

    logits = {}
    for name, (fn, state) in fns.items():
        out, cache = run(fn, state, cache, 1)
        logits[name] = np.asarray(out)
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, (fn, state) in fns.items():
            _, cache = run(fn, state, cache, 1)
            start = time.perf_counter()
            _, cache = run(fn, state, cache, steps)
            times[name].append((time.perf_counter() - start) / steps)
    return dict(batch=batch, cache=max_len, fill=fill,
                prefix_read=min(s for s in prefix_sizes(max_len) if s >= fill),
                prefix_ms=1e3 * float(np.median(times["prefix"])),
                whole_ms=1e3 * float(np.median(times["whole"])),
                speedup=float(np.median(np.asarray(times["whole"]) / np.asarray(times["prefix"]))),
                max_logit_diff=float(np.max(np.abs(logits["prefix"] - logits["whole"]))))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    models = {"quick": MODEL_QUICK} if args.quick else {"30M": MODEL_30M, "demo": MODEL_DEMO}
    cases = [("30M", 32, 192, fill) for fill in (64, 128, 192)]
    cases += [(name, 32, 1024, fill) for name in ("30M", "demo") for fill in (128, 256, 512, 1024)]
    repeats, steps = (3, 5) if args.quick else (7, 20)
    rows = []
    for name, batch, max_len, fill in cases:
        name = "quick" if args.quick else name
        model = CausalLM(DecoderConfig(**models[name]), rngs=nnx.Rngs(0))
        rows.append(dict(model=name, **time_case(model, batch, max_len, fill, repeats, steps)))
        print(rows[-1], flush=True)
    if args.quick:
        return
    result = dict(
        what=__doc__.splitlines()[0], command="python benchmarks/decode_prefix.py",
        machine=dict(cpu=platform.processor() or platform.machine(), cores=os.cpu_count(),
                     load_average=os.getloadavg(), jax=jax.__version__),
        models=models, repeats=repeats, steps_per_repeat=steps, cases=rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "decode_prefix.json").write_text(json.dumps(result, indent=1))
    lines = [f"# {result['what']}", "",
             f"`{result['command']}`; jax {jax.__version__}, {os.cpu_count()} cores, load "
             f"average {[round(x, 2) for x in os.getloadavg()]} after; float32, "
             f"median of {repeats} interleaved repeats of {steps} steps.", "",
             "| model | batch | cache slots | rows filled to | prefix read | whole cache ms/step | "
             "prefix ms/step | speed-up | max logit difference |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['batch']} | {r['cache']} | {r['fill']} | {r['prefix_read']} | "
                     f"{r['whole_ms']:.2f} | {r['prefix_ms']:.2f} | {r['speedup']:.2f}x | "
                     f"{r['max_logit_diff']:.1e} |")
    (out / "decode_prefix.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
