"""Decode-step attention over a cache held as separate per-block buffers vs one buffer per layer.

A decode step that reads only the cache's filled slots is the one lever left past the sampler's
bound against tunix (benchmarks/peers/README.md). One buffer per layer cannot give it on XLA:CPU:
a slice of the buffer, static or dynamic, is written out by a fusion of its own before the
YNNPACK reduction reads it (benchmarks/decode_prefix.py). This measures the layout that avoids
slicing: every layer's keys and values as separate buffers of `block` slots. A step writes its
token into the block holding its slot (a scatter per block, out-of-block rows dropped) and
attends over the first m blocks, m = the blocks the longest row fills, picked by a `lax.switch`
whose branch m scores each of its blocks with an einsum and combines them under one shared
maximum. Compared, per step of 20 chained steps (the cache carried as in the sampler's loop):
that, against the current kernel over the whole buffer (`cached_attention._decode_attention`
with the same write). Attention and writes only, all layers; no projections.

Not adopted yet (benchmarks/peers/README.md): it restructures the KV cache every backend and every
cache user shares (the writes, the extends' blocked attention, prefix copies, shardings, memory
plans), and the switch here grows as blocks squared, so long caches need bigger blocks or a
chain of per-block conditionals; whether it pays on TPU is not measured (no device).

    python benchmarks/block_cache.py            # writes benchmarks/results/block_cache.{json,md}
    python benchmarks/block_cache.py --quick    # small shapes, writes nothing
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

from matpo_jax.model.cached_attention import MASKED_SCORE, _decode_attention

RESULTS = Path(__file__).parent / "results"
STEPS = 20
# (name, batch, kv heads, group, head dim, layers, cache slots, block, fills)
CASES = [
    ("30M", 32, 4, 2, 64, 8, 192, 64, (64, 128, 192)),  # the peers' sampler bar
    ("demo", 32, 2, 2, 32, 3, 1024, 128, (128, 256, 512, 1024)),  # configs/synthetic_tiny.py
]
QUICK = [("quick", 8, 2, 2, 16, 2, 128, 32, (32, 128))]


def write_whole(k, v, slot, new):
    """One token per row into keys [B, K, D, S] / values [B, K, S, D] at slot[b]."""
    rows, heads = jnp.arange(k.shape[0])[:, None], jnp.arange(k.shape[1])[None, :]
    return (k.at[rows, heads, :, slot[:, None]].set(new),
            v.at[rows, heads, slot[:, None]].set(new))


def write_blocks(keys, values, slot, new):
    """The same into per-block buffers: each block takes the rows whose slot it holds."""
    block = keys[0].shape[-1]
    rows, heads = jnp.arange(keys[0].shape[0])[:, None], jnp.arange(keys[0].shape[1])[None, :]
    out_k, out_v = [], []
    for index, (k, v) in enumerate(zip(keys, values)):
        local = slot - index * block
        local = jnp.where((local >= 0) & (local < block), local, block)[:, None]  # block: dropped
        out_k.append(k.at[rows, heads, :, local].set(new, mode="drop"))
        out_v.append(v.at[rows, heads, local].set(new, mode="drop"))
    return tuple(out_k), tuple(out_v)


def attend_blocks(q, keys, values, lengths):
    """Attention of q [B, 1, K * G, D] over the first m blocks that hold every row's slots."""
    batch, _, heads, dim = q.shape
    kv, block = keys[0].shape[1], keys[0].shape[-1]
    filled = jnp.clip(-(-jnp.max(lengths) // block), 1, len(keys))

    def over(m):
        def attend(q, keys, values, lengths):
            qg = q.reshape(batch, kv, heads // kv, dim)
            scores = []
            for index in range(m):
                s = jnp.einsum("bkgd,bkds->bkgs", qg, keys[index]) * dim ** -0.5
                slots = index * block + jnp.arange(block)
                scores.append(jnp.where(slots < lengths[:, None, None, None], s, MASKED_SCORE))
            top = scores[0].max(-1, keepdims=True)
            for s in scores[1:]:
                top = jnp.maximum(top, s.max(-1, keepdims=True))
            probs = [jnp.exp(s - top) for s in scores]
            total = sum(p.sum(-1) for p in probs)
            out = sum(jnp.einsum("bkgs,bksd->bkgd", p, values[i]) for i, p in enumerate(probs))
            return (out / total[..., None]).reshape(batch, 1, heads * dim)
        return attend

    return jax.lax.switch(filled - 1, [over(m) for m in range(1, len(keys) + 1)],
                          q, keys, values, lengths)


def steps_fn(layout: str, batch, kv, group, dim):
    """STEPS chained decode steps (each layer's query depends on the previous output)."""
    heads = kv * group

    @jax.jit
    def run(q, keys, values, start):
        def step(i, carry):
            keys, values, acc = carry
            lengths = start + i
            out, new_keys, new_values = acc, [], []
            for k, v in zip(keys, values):
                new = out[:, :kv * dim].reshape(batch, kv, dim) * 1e-3
                query = q + 1e-9 * out.reshape(q.shape)
                if layout == "whole":
                    k, v = write_whole(k, v, lengths - 1, new)
                    slots = jnp.arange(k.shape[-1])[None, None, :]
                    o = _decode_attention(query, k, v, slots < lengths[:, None, None])
                else:
                    k, v = write_blocks(k, v, lengths - 1, new)
                    o = attend_blocks(query, k, v, lengths)
                out = out + o.reshape(acc.shape)
                new_keys.append(k)
                new_values.append(v)
            return new_keys, new_values, out
        init = (keys, values, jnp.zeros((batch, heads * dim), jnp.float32))
        return jax.lax.fori_loop(0, STEPS, step, init)[2]
    return run


def time_case(case, repeats):
    name, batch, kv, group, dim, layers, slots, block, fills = case
    rng = np.random.default_rng(0)
    draw = lambda *shape: jnp.asarray(rng.standard_normal(shape, np.float32))  # noqa: E731
    keys = [draw(batch, kv, dim, slots) for _ in range(layers)]
    values = [draw(batch, kv, slots, dim) for _ in range(layers)]
    split = lambda x, axis: tuple(  # noqa: E731
        jax.lax.slice_in_dim(x, i, i + block, axis=axis) for i in range(0, slots, block))
    block_keys = [split(k, 3) for k in keys]
    block_values = [split(v, 2) for v in values]
    q = draw(batch, 1, kv * group, dim)
    whole = steps_fn("whole", batch, kv, group, dim)
    blocks = steps_fn("blocks", batch, kv, group, dim)
    rows = []
    for fill in fills:
        start = jnp.full((batch,), fill - STEPS + 1, jnp.int32)  # the last step at `fill` slots
        runs = {"whole": lambda: whole(q, keys, values, start),
                "blocks": lambda: blocks(q, block_keys, block_values, start)}
        outs = {n: np.asarray(run()) for n, run in runs.items()}  # compiles
        times = {n: [] for n in runs}
        for _ in range(repeats):
            for n, run in runs.items():
                begin = time.perf_counter()
                jax.block_until_ready(run())
                times[n].append((time.perf_counter() - begin) / STEPS)
        whole_ms, blocks_ms = (1e3 * float(np.median(times[n])) for n in ("whole", "blocks"))
        rows.append(dict(model=name, batch=batch, layers=layers, cache=slots, block=block,
                         fill=fill, blocks_read=-(-fill // block), whole_ms=whole_ms,
                         blocks_ms=blocks_ms, speedup=whole_ms / blocks_ms,
                         max_abs_diff=float(np.max(np.abs(outs["whole"] - outs["blocks"])))))
        print(rows[-1], flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    rows = [row for case in (QUICK if args.quick else CASES)
            for row in time_case(case, 3 if args.quick else args.repeats)]
    if args.quick:
        return
    result = dict(what=__doc__.splitlines()[0], command="python benchmarks/block_cache.py",
                  machine=dict(cpu=platform.processor() or platform.machine(),
                               cores=os.cpu_count(), load_average=os.getloadavg(),
                               jax=jax.__version__),
                  steps_per_repeat=STEPS, repeats=args.repeats, rows=rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "block_cache.json").write_text(json.dumps(result, indent=1))
    lines = [f"# {result['what']}", "",
             f"`{result['command']}`; jax {jax.__version__}, {os.cpu_count()} cores, load average "
             f"{[round(x, 2) for x in os.getloadavg()]} after; float32, attention and cache "
             f"writes of every layer, median of {args.repeats} interleaved repeats of {STEPS} "
             "chained steps ending at the fill.", "",
             "| shape | batch | layers | cache slots | block | filled slots | blocks read | "
             "one buffer ms/step | per-block buffers ms/step | speed-up | max difference |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['batch']} | {r['layers']} | {r['cache']} | "
                     f"{r['block']} | {r['fill']} | {r['blocks_read']} | {r['whole_ms']:.2f} | "
                     f"{r['blocks_ms']:.2f} | {r['speedup']:.2f}x | {r['max_abs_diff']:.1e} |")
    (out / "block_cache.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
