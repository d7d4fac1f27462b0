"""How far each sampler is from its matrix multiplications alone, and so what ratio is possible.

The sampler bar (ours >= 1.5x tunix's tokens/s at batch 32, greedy) is met in some runs and
missed in others (`peers_sampler.md`). Both sides run the same model on the same XLA:CPU, so
neither can be faster than the model's weight matmuls at those shapes. This times, in one process and interleaved with
both samplers: the prefill's linear layers (every projection of every layer over the batch's
prompt positions, and the vocabulary head over one position per row) and one decode step's
(the same over one position per row) as bare jitted float32 matmuls, chained layer by layer so
that none can be skipped. Attention, norms, RoPE, sampling and the cache are left out, so these
are lower bounds. Then per shape:

    ours / floor and tunix / floor, for the prefill (the first-token call) and the decode step
    the best any sampler could do against tunix: tunix's call / (prefill floor + steps x decode floor)

Also timed, alone: one decode step's attention over every layer's whole cache, as a plain einsum
(for scale) and as the kernel our step runs (`cached_attention._decode_attention`, heads-major
cache). Matmul floor + our attention is what a step that reads the whole cache cannot go below
with our kernel; `ours_decode_over_floor_and_attention` says how close our step is to it. Two
more bounds against tunix's call: a sampler whose prefill is the matmul floor and whose steps
are matmul floor + our attention over the whole cache, and the same reading only the filled
slots (the attention's cost scaled by the mean filled fraction of the cache while decoding).

    python benchmarks/peers/matmul_floor.py [--sizes 4M 30M] [--repeats 7] [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import ours_side  # noqa: E402
import tunix_side  # noqa: E402
from matpo_jax.model.cached_attention import _decode_attention  # noqa: E402

BATCH, PROMPT_LEN, NEW_TOKENS = 32, 64, 128  # the sampler bar's setting (peers_sampler.md)


def layer_weights(fields: dict, seed: int = 0) -> tuple[list[tuple], jax.Array]:
    """Random float32 weights of the shape's projections (q, k, v, o, gate, up, down) per layer,
    and its vocabulary head."""
    h, i, hd = fields["hidden_size"], fields["intermediate_size"], fields["head_dim"]
    q, kv = fields["num_attention_heads"] * hd, fields["num_key_value_heads"] * hd
    rng = np.random.default_rng(seed)
    draw = lambda *shape: jnp.asarray(rng.standard_normal(shape, np.float32) * 0.02)  # noqa: E731
    layers = [(draw(h, q), draw(h, kv), draw(h, kv), draw(q, h), draw(h, i), draw(h, i),
               draw(i, h)) for _ in range(fields["num_hidden_layers"])]
    return layers, draw(h, fields["vocab_size"])


@functools.partial(jax.jit, static_argnames="head_rows")
def linear_layers(x, layers, head, head_rows: int):
    """x [M, h] through every layer's projections (the attention output stood in by the query
    projection, so o still multiplies [M, q]); k, v and the head's logits are reduced into the
    result so XLA computes them."""
    keep = jnp.zeros((), x.dtype)
    for wq, wk, wv, wo, wg, wu, wd in layers:
        q = x @ wq
        keep += jnp.mean(x @ wk) + jnp.mean(x @ wv)
        x = x + q @ wo
        x = x + ((x @ wg) * (x @ wu)) @ wd
    return jnp.mean(x[-head_rows:] @ head) + keep


@jax.jit
def cache_attention(q, keys, values):
    """One decode step's attention of every layer over the whole cache (GQA) as a plain einsum:
    q [L, B, kv, g, d], keys and values [L, B, kv, len, d]."""
    probs = jax.nn.softmax(jnp.einsum("lbkgd,lbksd->lbkgs", q, keys), axis=-1)
    return jnp.mean(jnp.einsum("lbkgs,lbksd->lbkgd", probs, values))


@jax.jit
def our_cache_attention(q, keys, values, mask):
    """The same attention as our decode step computes it, layer by layer: q [B, 1, H, d]; per
    layer (separate buffers, as in our cache) keys [B, kv, d, len] and values [B, kv, len, d];
    mask [B, 1, len] (an argument, as in the step: a constant mask is folded away and XLA then
    fuses the rest differently)."""
    # Chained as in the step (each layer's query depends on the previous output): independent
    # layers would be fused into one reduction that XLA:CPU runs several times slower.
    out = jnp.zeros(q.shape[:2] + (q.shape[2] * q.shape[3],), q.dtype)
    for k, v in zip(keys, values):
        out = out + _decode_attention(q + 1e-9 * out.reshape(q.shape), k, v, mask)
    return out


def floor_runs(fields: dict):
    """(prefill floor, decode-step floor, decode-step attention over a full cache as a plain
    einsum, and as our kernel) as zero-argument runs that block until done."""
    layers, head = layer_weights(fields)
    h, d = fields["hidden_size"], fields["head_dim"]
    kv, groups = fields["num_key_value_heads"], fields["num_attention_heads"] // fields["num_key_value_heads"]
    prefill_x = jnp.ones((BATCH * PROMPT_LEN, h), jnp.float32) * 0.01
    decode_x = jnp.ones((BATCH, h), jnp.float32) * 0.01
    cache = (fields["num_hidden_layers"], BATCH, kv, PROMPT_LEN + NEW_TOKENS, d)
    q = jnp.ones(cache[:3] + (groups, d), jnp.float32) * 0.01
    keys, values = jnp.ones(cache, jnp.float32) * 0.01, jnp.ones(cache, jnp.float32) * 0.02
    our_q = jnp.ones((BATCH, 1, kv * groups, d), jnp.float32) * 0.01
    our_keys = [jnp.ones(cache[1:3] + (d, cache[3]), jnp.float32) * 0.01 for _ in range(cache[0])]
    our_values = [jnp.ones(cache[1:], jnp.float32) * 0.02 for _ in range(cache[0])]
    our_mask = jnp.ones((BATCH, 1, cache[3]), bool)
    return (lambda: linear_layers(prefill_x, layers, head, BATCH).block_until_ready(),
            lambda: linear_layers(decode_x, layers, head, BATCH).block_until_ready(),
            lambda: cache_attention(q, keys, values).block_until_ready(),
            lambda: our_cache_attention(our_q, our_keys, our_values, our_mask).block_until_ready())


def bench_size(size: str, path: str, repeats: int) -> dict:
    fields = common.SIZES[size]
    max_len = PROMPT_LEN + NEW_TOKENS
    ours = ours_side.Generator(ours_side.load(path), max_len)
    tunix = tunix_side.make_sampler(tunix_side.load(path), max_len)
    prompts = common.prompts(BATCH, PROMPT_LEN, fields["vocab_size"], seed=BATCH)
    floor_prefill, floor_decode, floor_attention, our_attention = floor_runs(fields)
    runs = {
        "ours": lambda: ours(prompts, NEW_TOKENS, ours_side.GREEDY),
        "tunix": lambda: tunix_side.generate(tunix, prompts, NEW_TOKENS),
        "ours_first": lambda: ours(prompts, 1, ours_side.GREEDY),
        "tunix_first": lambda: tunix_side.generate(tunix, prompts, 1),
        "floor_prefill": floor_prefill,
        "floor_decode": floor_decode,
        "floor_attention": floor_attention,
        "our_attention": our_attention,
    }
    times = common.interleaved_medians(runs, repeats)
    med = {name: t["median"] for name, t in times.items()}
    steps = NEW_TOKENS - 1
    decode = {side: (med[side] - med[f"{side}_first"]) / steps for side in ("ours", "tunix")}
    floor_call = med["floor_prefill"] + steps * med["floor_decode"]
    # A sampler that also attends (with our kernel) over the whole cache every step, and one that
    # reads only each step's filled slots (attention cost taken as proportional to slots read).
    max_len = PROMPT_LEN + NEW_TOKENS
    filled = np.mean([(PROMPT_LEN + t) / max_len for t in range(1, NEW_TOKENS)])
    whole_cache_call = floor_call + steps * med["our_attention"]
    filled_only_call = floor_call + steps * filled * med["our_attention"]
    return dict(
        size=size, batch=BATCH, prompt_len=PROMPT_LEN, new_tokens=NEW_TOKENS, seconds=times,
        ms=dict(ours_prefill=1e3 * med["ours_first"], tunix_prefill=1e3 * med["tunix_first"],
                floor_prefill=1e3 * med["floor_prefill"], ours_decode=1e3 * decode["ours"],
                tunix_decode=1e3 * decode["tunix"], floor_decode=1e3 * med["floor_decode"],
                floor_attention=1e3 * med["floor_attention"],
                our_attention=1e3 * med["our_attention"]),
        over_floor=dict(ours_prefill=med["ours_first"] / med["floor_prefill"],
                        tunix_prefill=med["tunix_first"] / med["floor_prefill"],
                        ours_decode=decode["ours"] / med["floor_decode"],
                        tunix_decode=decode["tunix"] / med["floor_decode"],
                        ours_call=med["ours"] / floor_call, tunix_call=med["tunix"] / floor_call,
                        ours_decode_over_floor_and_attention=(
                            decode["ours"] / (med["floor_decode"] + med["our_attention"]))),
        speedup=med["tunix"] / med["ours"],
        best_possible_speedup=med["tunix"] / floor_call,
        best_reading_whole_cache=med["tunix"] / whole_cache_call,
        best_reading_filled_slots=med["tunix"] / filled_only_call, filled_fraction=float(filled))


def markdown(result: dict) -> str:
    env = result["environment"]
    lines = [
        "# The samplers against their matmuls alone (batch 32, greedy)", "",
        f"`{result['command']}`. jax {env['jax']}, {env['cores']} cores, load average "
        f"{env['load_before']} before, {env['load_after']} after. Prompt {PROMPT_LEN} tokens, "
        f"{NEW_TOKENS} new tokens per row, float32; medians of {result['repeats']} interleaved "
        "repeats. Floor = the linear layers' matmuls alone (a lower bound: no attention, norms, "
        "RoPE, sampling or cache).", "",
        "| model | prefill ms: ours / tunix / floor | decode ms/step: ours / tunix / floor "
        "(+ attention over the full cache: plain einsum / our kernel) | ours / floor (prefill, "
        "decode, call) | tunix / floor (prefill, decode, call) | ours decode / (floor + our "
        "attention) | speed-up | best possible: matmuls only / + our attention over the whole "
        "cache / + over the filled slots only |",
        "|---|---|---|---|---|---:|---:|---:|"]
    for row in result["rows"]:
        ms, over = row["ms"], row["over_floor"]
        lines.append(
            f"| {row['size']} | {ms['ours_prefill']:.0f} / {ms['tunix_prefill']:.0f} / "
            f"{ms['floor_prefill']:.0f} | {ms['ours_decode']:.2f} / {ms['tunix_decode']:.2f} / "
            f"{ms['floor_decode']:.2f} (+{ms['floor_attention']:.2f} / "
            f"{ms['our_attention']:.2f}) | "
            f"{over['ours_prefill']:.2f}, {over['ours_decode']:.2f}, "
            f"{over['ours_call']:.2f} | {over['tunix_prefill']:.2f}, {over['tunix_decode']:.2f}, "
            f"{over['tunix_call']:.2f} | {over['ours_decode_over_floor_and_attention']:.2f} | "
            f"{row['speedup']:.2f}x | "
            f"{row['best_possible_speedup']:.2f}x / {row['best_reading_whole_cache']:.2f}x / "
            f"{row['best_reading_filled_slots']:.2f}x |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["4M", "30M"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "results"))
    args = parser.parse_args()
    load_before = common.load_average()
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for size in args.sizes:
            rows.append(bench_size(size, common.write_checkpoint(size, os.path.join(tmp, size)),
                                   args.repeats))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "seconds"}), flush=True)
    result = dict(command="python benchmarks/peers/matmul_floor.py " + " ".join(sys.argv[1:]),
                  environment=dict(jax=jax.__version__, cores=os.cpu_count(),
                                   load_before=load_before, load_after=common.load_average()),
                  repeats=args.repeats, rows=rows)
    common.write_results(args.out, "peers_matmul_floor", result, markdown(result))


if __name__ == "__main__":
    main()
