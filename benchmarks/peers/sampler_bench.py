"""Sampler throughput side by side: tunix's `Sampler` vs our slot sampler's `generate`.

Same checkpoint directory (loaded by each side's own loader), same prompts, same cache length,
float32, every row forced to the full length. Per (shape, batch): tokens/s of the whole call
(prefill + decode + returning the tokens to the host), first-token latency (the same call with one
new token: prefill + first sample + return), and the decode time per step that follows from the
two. Both sides run interleaved in one process, `--repeats` times after a warm-up call (which
compiles; its time is reported as compile_s); the median is reported. Greedy at every batch;
sampled (temperature 1, no truncation) at the largest batch.

    python benchmarks/peers/sampler_bench.py [--quick] [--sizes 4M 30M] [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import ours_side  # noqa: E402
import tunix_side  # noqa: E402
from matpo_jax.sampler.loop import Sampling  # noqa: E402

SAMPLED = Sampling(temperature=1.0)


def timed_first_call(run):
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def bench_shape(size, path, batches, prompt_len, new_tokens, repeats, sampled_batch):
    fields = common.SIZES[size]
    ours_model, tunix_model = ours_side.load(path), tunix_side.load(path)
    params = sum(x.size for x in jax.tree.leaves(ours_model))
    max_len = prompt_len + new_tokens
    ours = ours_side.Generator(ours_model, max_len)
    tunix = tunix_side.make_sampler(tunix_model, max_len)
    rows = []
    for batch in batches:
        prompts = common.prompts(batch, prompt_len, fields["vocab_size"], seed=batch)
        modes = [("greedy", {}, ours_side.GREEDY)]
        if batch == sampled_batch:
            modes.append(("sampled", dict(temperature=1.0, top_p=1.0, seed=0), SAMPLED))
        for mode, tunix_kw, sampling in modes:
            runs = {
                "ours": lambda: ours(prompts, new_tokens, sampling),
                "tunix": lambda: tunix_side.generate(tunix, prompts, new_tokens, **tunix_kw),
                "ours_first": lambda: ours(prompts, 1, sampling),
                "tunix_first": lambda: tunix_side.generate(tunix, prompts, 1, **tunix_kw),
            }
            compile_s = {name: timed_first_call(run) for name, run in runs.items()}
            times = common.interleaved_medians(runs, repeats)
            med = {name: t["median"] for name, t in times.items()}
            row = dict(size=size, params=params, batch=batch, mode=mode, prompt_len=prompt_len,
                       new_tokens=new_tokens, seconds=times, first_call_s=compile_s)
            for side in ("ours", "tunix"):
                row[f"{side}_tok_s"] = batch * new_tokens / med[side]
                row[f"{side}_first_token_ms"] = 1e3 * med[f"{side}_first"]
                row[f"{side}_decode_ms_per_step"] = (
                    1e3 * (med[side] - med[f"{side}_first"]) / (new_tokens - 1))
            row["speedup"] = med["tunix"] / med["ours"]
            row["first_token_speedup"] = med["tunix_first"] / med["ours_first"]
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "seconds"}), common.load_average(),
                  flush=True)
    return rows


def markdown(result):
    env, s = result["environment"], result["settings"]
    lines = [
        "# Sampler: matpo_jax slot sampler vs tunix `Sampler` (same weights, same prompts)",
        "",
        f"`{result['command']}`. CPU ({env['cores']} cores, shared with other jobs: load average "
        f"{env['load_before']} before, {env['load_after']} after), jax {env['jax']}, tunix "
        f"{env['tunix']}, one process, one venv (`.venv-peers`). float32, prompt "
        f"{s['prompt_len']} tokens, {s['new_tokens']} new tokens per row, EOS never sampled, both "
        f"caches {s['prompt_len'] + s['new_tokens']} positions. Time = the whole call, median of "
        f"{s['repeats']} interleaved repeats after a warm-up (compile excluded; first-call "
        "seconds listed separately). First token = the same call with 1 new token.",
        "",
        "Speed-up = tunix time / ours, of the medians; 'best of' = of the fastest repeats; "
        "'range' = the per-repeat ratios (a repeat's two runs back to back), which show the noise.",
        "",
        "| model | batch | mode | ours tok/s | tunix tok/s | speed-up | best of | range | "
        "ours first token ms | "
        "tunix first token ms | ours decode ms/step | tunix decode ms/step | first call s "
        "(ours / tunix) |",
        "|---|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        ours, tunix = r["seconds"]["ours"], r["seconds"]["tunix"]
        per_repeat = [t / o for o, t in zip(ours["all"], tunix["all"])]
        lines.append(
            f"| {r['size']} | {r['batch']} | {r['mode']} | {r['ours_tok_s']:,.0f} | "
            f"{r['tunix_tok_s']:,.0f} | {r['speedup']:.2f}x | {tunix['min'] / ours['min']:.2f}x | "
            f"{min(per_repeat):.2f}-{max(per_repeat):.2f} | {r['ours_first_token_ms']:.1f} | "
            f"{r['tunix_first_token_ms']:.1f} | {r['ours_decode_ms_per_step']:.2f} | "
            f"{r['tunix_decode_ms_per_step']:.2f} | {r['first_call_s']['ours']:.1f} / "
            f"{r['first_call_s']['tunix']:.1f} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny lengths, writes nothing")
    parser.add_argument("--sizes", nargs="+", default=["4M", "30M"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "results"))
    args = parser.parse_args()
    prompt_len, new_tokens = (16, 8) if args.quick else (64, 128)
    repeats = 1 if args.quick else args.repeats
    import tunix  # noqa: F401  (only for its version)
    from importlib.metadata import version
    load_before = common.load_average()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            path = common.write_checkpoint(size, os.path.join(tmp, size))
            rows += bench_shape(size, path, args.batches, prompt_len, new_tokens, repeats,
                                sampled_batch=max(args.batches))
    result = dict(
        command="make bench-peers  # python benchmarks/peers/sampler_bench.py " + " ".join(sys.argv[1:]),
        environment=dict(jax=jax.__version__, tunix=version("google-tunix"),
                         cpu=platform.processor() or platform.machine(), cores=os.cpu_count(),
                         load_before=load_before, load_after=common.load_average(),
                         machine_shared=True),
        settings=dict(prompt_len=prompt_len, new_tokens=new_tokens, repeats=repeats,
                      dtype="float32", timing="median of interleaved repeats after a warm-up"),
        rows=rows)
    if args.quick:
        return
    common.write_results(args.out, "peers_sampler", result, markdown(result))


if __name__ == "__main__":
    main()
