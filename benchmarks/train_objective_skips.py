"""The train step's objective with and without its two skips, side by side in one run.

1. Attention key blocks before a query block's segments begin (`packed_attention.key_block_starts`):
   masked for every query of the block, so skipping them changes no bit.
2. The output head on loss positions only (`logprobs.scored_next_token_logprobs`): an SFT row
   trains ~15% of its positions, an RL row its sampled turns; the rest need no logits.

Arms, each compiled under its own switches and timed fwd+bwd (the gradient of
`loss.model_objective` w.r.t. all parameters), repeats interleaved: `every block, whole rows`
(before both), `skip blocks, whole rows`, `skip blocks, loss positions` (the train step now).
Batches: the demo model (configs/synthetic_tiny.py's shape) on packed rows of 1,024 tokens laid
out like the demo's (first-fit-decreasing of worker-like 440-760 and planner-like 280-520 token
sequences, a trained span of ~15% in each): an SFT step's 2 rows and one RL micro-batch of 16.
The outputs of the first and second arm are compared bitwise; the third within float rounding.

    python benchmarks/train_objective_skips.py           # writes benchmarks/results/train_objective_skips.{json,md}
    python benchmarks/train_objective_skips.py --quick   # fewer repeats, writes nothing
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from matpo_jax.config import RLSection
from matpo_jax.model import DecoderConfig, CausalLM
from matpo_jax.model import packed_attention
from matpo_jax.trainer import logprobs as logprobs_lib
from matpo_jax.trainer import loss as loss_lib
from matpo_jax.trainer import packing
from matpo_jax.trainer.packing import PackedBatch
from matpo_jax.run.runtime import loss_config

RESULTS = Path(__file__).parent / "results"
MODEL_DEMO = dict(vocab_size=3072, hidden_size=128, intermediate_size=384, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32)
ROW = 1024
ARMS = ("every block, whole rows", "skip blocks, whole rows", "skip blocks, loss positions")


def demo_like_batch(rng, rows: int) -> PackedBatch:
    """`rows` packed rows of demo-like sequences (first-fit-decreasing), a trained span in each."""
    lengths = []
    while len(packing.first_fit_decreasing(lengths, ROW)) <= rows:
        lengths.append(int(rng.integers(440, 761) if rng.random() < 0.6 else
                           rng.integers(280, 521)))
    bins = packing.first_fit_decreasing(lengths, ROW)[:rows]
    shape = (rows, ROW)
    seg, pos, mask = np.zeros(shape, np.int32), np.zeros(shape, np.int32), np.zeros(shape)
    for r, members in enumerate(bins):
        start = 0
        for k, i in enumerate(members, start=1):
            n = lengths[i]
            seg[r, start:start + n], pos[r, start:start + n] = k, np.arange(n)
            trained = max(1, int(0.15 * n))
            mask[r, start + n - trained:start + n] = 1.0
            start += n
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    return PackedBatch(
        tokens=jnp.asarray(rng.integers(1, MODEL_DEMO["vocab_size"], shape), jnp.int32),
        positions=jnp.asarray(pos), segment_ids=jnp.asarray(seg),
        role_ids=jnp.asarray((seg % 2 == 0).astype(np.int32)), loss_mask=f32(mask),
        advantages=f32(rng.choice([-1.0, 1.0], (rows, 1)) * np.ones(shape)),
        old_logprobs=f32(-rng.uniform(2, 6, shape)), loss_weights=f32(mask / mask.sum()),
        rollout_ids=jnp.zeros(shape, jnp.int32))


@contextlib.contextmanager
def switches(arm: str):
    """The arm's code path while its function is traced."""
    saved = packed_attention.key_block_starts, logprobs_lib.score_tokens
    if arm == ARMS[0]:
        packed_attention.key_block_starts = lambda segment_ids, block, prefix_ids=None: (
            jnp.zeros(segment_ids.shape[1] // block, jnp.int32))
    if arm in ARMS[:2]:
        whole = saved[1]
        logprobs_lib.score_tokens = lambda *a, scored=None, scored_capacity=None, **k: whole(*a, **k)
    try:
        yield
    finally:
        packed_attention.key_block_starts, logprobs_lib.score_tokens = saved


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    repeats = 2 if args.quick else args.repeats
    rng = np.random.default_rng(0)
    graphdef, params = nnx.split(CausalLM(DecoderConfig(**MODEL_DEMO), rngs=nnx.Rngs(0)))
    config = loss_config(RLSection())  # the default experiment's loss
    rows_out = []
    for case, rows, objective in (("SFT step", 2, "sft"), ("RL micro-batch", 16, "rl")):
        batch = demo_like_batch(rng, rows)
        starts = np.asarray(packed_attention.key_block_starts(batch.segment_ids, 128))
        fns, outs = {}, {}
        for arm in ARMS:
            def objective_grad(p, arm=arm):
                return jax.value_and_grad(lambda q: loss_lib.model_objective(
                    nnx.merge(graphdef, q), batch, config, objective=objective)[0])(p)
            fn = jax.jit(objective_grad)
            with switches(arm):
                outs[arm] = jax.block_until_ready(fn(params))  # traced and compiled here
            fns[arm] = fn
        times = {arm: [] for arm in ARMS}
        for _ in range(repeats):
            for arm in ARMS:
                t0 = time.perf_counter()
                jax.block_until_ready(fns[arm](params))
                times[arm].append(time.perf_counter() - t0)
        leaves = {arm: jax.tree.leaves(outs[arm]) for arm in ARMS}
        bitwise = all(np.array_equal(a, b) for a, b in zip(leaves[ARMS[0]], leaves[ARMS[1]]))
        rel = max(float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(b)) + 1e-30))
                  for a, b in zip(leaves[ARMS[2]], leaves[ARMS[1]]))
        base = np.median(times[ARMS[0]])
        for arm in ARMS:
            med = float(np.median(times[arm]))
            rows_out.append(dict(case=case, rows=rows, arm=arm, median_ms=med * 1e3,
                                 min_ms=float(min(times[arm])) * 1e3, speedup=float(base / med),
                                 key_block_starts=starts.tolist(),
                                 trained_fraction=float(np.asarray(batch.loss_mask).mean()),
                                 skip_bitwise_equal=bitwise, head_max_rel_diff=rel))
        print(f"{case}: starts {starts.tolist()}, skip bitwise equal {bitwise}, loss-position "
              f"head max rel diff {rel:.1e}", flush=True)
        for r in rows_out[-3:]:
            print(f"  {r['arm']:28s} {r['median_ms']:7.0f} ms (min {r['min_ms']:.0f})  "
                  f"{r['speedup']:.2f}x", flush=True)
    if args.quick:
        return
    meta = dict(machine=platform.platform(), cpus=os.cpu_count(), jax=jax.__version__,
                cpu_model=next((line.split(":", 1)[1].strip() for line in
                                open("/proc/cpuinfo") if line.startswith("model name")), "?"),
                repeats=repeats)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "train_objective_skips.json").write_text(json.dumps(dict(meta=meta, rows=rows_out),
                                                                   indent=1))
    lines = ["# The train step's objective: attention block skip and loss-position head", "",
             f"{meta['cpu_model']}, {meta['cpus']} CPUs, jax {meta['jax']}; demo model, rows of "
             f"{ROW} tokens; fwd+bwd of `loss.model_objective`, median (min) of {repeats} "
             "interleaved repeats. Produced by `python benchmarks/train_objective_skips.py`.", "",
             "| batch | arm | fwd+bwd ms | speed-up vs every block, whole rows |",
             "|---|---|---|---|"]
    for r in rows_out:
        lines.append(f"| {r['case']} ({r['rows']} rows, {r['trained_fraction']:.0%} trained) | "
                     f"{r['arm']} | {r['median_ms']:.0f} ({r['min_ms']:.0f}) | "
                     f"**{r['speedup']:.2f}x** |")
    lines += ["", "Skipped key blocks change no bit: "
              + ", ".join(f"{r['case']} {r['skip_bitwise_equal']}" for r in rows_out[::3])
              + "; the loss-position head's largest relative difference (loss and every "
              "gradient leaf) from the whole-row head: "
              + ", ".join(f"{r['case']} {r['head_max_rel_diff']:.1e}" for r in rows_out[::3])
              + ". Key block starts per query block: "
              + "; ".join(f"{r['case']} {r['key_block_starts']}" for r in rows_out[::3]) + "."]
    (RESULTS / "train_objective_skips.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
