"""Packed vs padded RL train step, side by side in one run, on a MATPO-like length mix.

Planner rollouts are long (~600-1000 tokens) and each spawns a few short workers (~100-300
tokens). The padded baseline puts one sequence per row; the packed step puts several per row
with segment ids. Both run the same jitted step (same model, loss, optimizer, micro-batching of one
row per micro-batch) on the same trajectories. Reported: trained tokens/s (non-padding tokens of
the batch per second of step time, and loss tokens/s), packing efficiency, and the packed step's
achieved model FLOP/s (6 x matmul params x tokens + causal within-segment attention) as a fraction
of this CPU's measured float32 `jnp.dot` peak.

    python benchmarks/train_step.py            # ~30M-parameter Qwen3, writes benchmarks/results/
    python benchmarks/train_step.py --quick    # tiny smoke run, writes nothing
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

from matpo_jax import parallel
from matpo_jax.config import RLSection
from matpo_jax.model import DecoderConfig, CausalLM
from matpo_jax.trainer import packing
from matpo_jax.trainer import step as ts
from matpo_jax.rl.advantages import group_advantages
from matpo_jax.run.runtime import loss_config

RESULTS = Path(__file__).parent / "results"
LOSS = loss_config(RLSection())  # the default experiment's loss
ROWS_PER_MICRO = 0  # set from --rows-per-micro
MODEL_30M = dict(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=7,
                 num_attention_heads=8, num_key_value_heads=4, head_dim=64)
MODEL_TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=32)


def matmul_peak(n: int = 2048, seconds: float = 3.0) -> dict:
    """Sustained float32 matmul throughput: FLOP per wall second (best single call) and FLOP per
    CPU second of this process (all threads), the latter being robust to other load on a shared
    machine."""
    a = jnp.ones((n, n), jnp.float32)
    dot = jax.jit(jnp.dot)
    dot(a, a).block_until_ready()
    best, calls = float("inf"), 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - wall0 < seconds:
        start = time.perf_counter()
        dot(a, a).block_until_ready()
        best = min(best, time.perf_counter() - start)
        calls += 1
    cpu = time.process_time() - cpu0
    flops = 2 * n ** 3
    return dict(flops_per_s=flops / best, flops_per_cpu_s=flops * calls / cpu)


def rollout_like(length: int, prompt: int, turns: int, rng, vocab: int, rollout_id: int,
                 role_id: int, group_id: int, advantage: float) -> packing.TrainSequence:
    """A prompt, then `turns` sampled turns alternating with tool responses."""
    trainable = np.zeros(length, bool)
    cuts = np.sort(rng.choice(np.arange(prompt + 1, length), 2 * turns - 1, replace=False))
    bounds = [prompt, *cuts, length]
    for k in range(0, len(bounds) - 1, 2):  # even pieces are sampled, odd ones tool responses
        trainable[bounds[k]:bounds[k + 1]] = True
    return packing.TrainSequence(
        tokens=rng.integers(0, vocab, length).astype(np.int32), trainable=trainable,
        old_logprobs=np.where(trainable, -rng.uniform(0.05, 3.0, length), 0).astype(np.float32),
        advantage=advantage, role_id=role_id, rollout_id=rollout_id, group_id=group_id)


def length_mix(planners: int, vocab: int, seed: int, scale: float = 1.0):
    rng = np.random.default_rng(seed)
    adv = group_advantages(rng.integers(0, 2, planners).astype(float))
    seqs, next_id = [], 0
    for i in range(planners):
        planner_id = next_id
        seqs.append(rollout_like(int(rng.integers(600, 1001) * scale), int(150 * scale), 4, rng,
                                 vocab, planner_id, 0, planner_id, float(adv[i])))
        next_id += 1
        for _ in range(int(rng.integers(2, 5))):
            seqs.append(rollout_like(int(rng.integers(100, 301) * scale), int(60 * scale), 2, rng,
                                     vocab, next_id, 1, planner_id, float(adv[i])))
            next_id += 1
    return seqs


def useful_flops(batch: packing.PackedBatch, config: DecoderConfig, matmul_params: int) -> float:
    """Training FLOPs of the real tokens: 6*N per token plus causal attention inside segments."""
    tokens = int((batch.segment_ids > 0).sum())
    attn_width = config.num_attention_heads * config.head_dim
    attention = 0.0
    for row in batch.segment_ids:
        for seg in np.unique(row[row > 0]):
            n = int((row == seg).sum())
            # QK^T and PV, 2 FLOPs per MAC, causal -> n(n+1)/2 pairs; x3 for forward + backward.
            attention += 3 * 2 * 2 * attn_width * n * (n + 1) / 2
    return 6 * matmul_params * tokens + attention * config.num_hidden_layers


class Layout:
    """One layout's compiled step and its timings; `step()` runs and times one blocking step."""

    def __init__(self, name, batch, model, mesh, tx):
        self.name, self.batch = name, batch
        rows = batch.shape[0]
        # Same micro-batch size (rows) in both layouts; bigger micro-batches mean bigger matmuls.
        micro = max(1, rows // max(1, ROWS_PER_MICRO)) if ROWS_PER_MICRO else 1
        while rows % micro:
            micro += 1
        config = ts.TrainStepConfig(micro_batches=micro, loss=LOSS)
        graphdef, self.state, shardings = ts.init_train_state(model, tx, mesh)
        step = ts.make_train_step(graphdef, tx, config, mesh, shardings)
        self.device_batch = jax.device_put(batch, parallel.batch_sharding(mesh))
        start = time.perf_counter()
        self.compiled = step.jitted.lower(self.state, self.device_batch).compile()
        self.compile_s = time.perf_counter() - start
        self.times, self.cpu_times, self.metrics = [], [], None

    def step(self):
        start, cpu_start = time.perf_counter(), time.process_time()
        self.state, self.metrics = self.compiled(self.state, self.device_batch)
        jax.block_until_ready((self.state, self.metrics))
        self.times.append(time.perf_counter() - start)
        self.cpu_times.append(time.process_time() - cpu_start)

    def result(self) -> dict:
        batch, rows = self.batch, self.batch.shape[0]
        step_s, step_cpu_s = min(self.times), min(self.cpu_times)
        real_tokens = int((batch.segment_ids > 0).sum())
        loss = float(self.metrics["loss"])
        print(f"{self.name}: shape {batch.shape}, efficiency {batch.efficiency():.3f}, compile "
              f"{self.compile_s:.1f}s, step {step_s:.2f}s ({step_cpu_s:.1f} CPU s), "
              f"loss {loss:.4f}", flush=True)
        return dict(layout=self.name, rows=rows, row_len=batch.shape[1],
                    efficiency=batch.efficiency(), tokens=real_tokens,
                    loss_tokens=batch.num_loss_tokens(), compile_s=self.compile_s,
                    step_s=step_s, step_cpu_s=step_cpu_s, all_step_s=self.times,
                    tokens_per_s=real_tokens / step_s, tokens_per_cpu_s=real_tokens / step_cpu_s,
                    loss_tokens_per_s=batch.num_loss_tokens() / step_s, loss=loss)


def time_layouts(layouts: dict, model, mesh, tx, repeats) -> dict:
    """Compile every layout ahead of time, then time `repeats` rounds of one step per layout,
    interleaved so that a change in the machine's other load hits both layouts alike."""
    compiled = [Layout(name, batch, model, mesh, tx) for name, batch in layouts.items()]
    for _ in range(repeats):
        for layout in compiled:
            layout.step()
    return {layout.name: layout.result() for layout in compiled}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--planners", type=int, default=4)
    # Best of a few steps, as the matmul peak is the best of many calls: on a shared machine a
    # single step can absorb a burst of other load.
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rows-per-micro", type=int, default=1,
                        help="rows per gradient-accumulation micro-batch (0: the whole batch)")
    parser.add_argument("--quick", action="store_true", help="tiny model and lengths; no files")
    args = parser.parse_args()
    global ROWS_PER_MICRO
    ROWS_PER_MICRO = args.rows_per_micro

    load_start = os.getloadavg()
    model_kw, scale = (MODEL_TINY, 0.125) if args.quick else (MODEL_30M, 1.0)
    config = DecoderConfig(**model_kw)
    model = CausalLM(config, rngs=nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)
    total_params = sum(x.size for x in jax.tree.leaves(params))
    # The input embedding is a lookup, not a matmul (with tied embeddings it IS the lm head).
    embed = 0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size
    matmul_params = total_params - embed

    seqs = length_mix(args.planners, config.vocab_size, args.seed, scale)
    longest = max(map(len, seqs))
    packed = packing.pack_sequences(seqs, 2 * packing.round_up(longest, 128), row_len_multiple=128,
                                    loss_config=LOSS)
    padded = packing.pad_sequences(seqs, packing.round_up(longest, 128), loss_config=LOSS)
    print(f"{total_params / 1e6:.1f}M params, {len(seqs)} sequences "
          f"({args.planners} planners), {sum(map(len, seqs))} tokens; load {load_start}",
          flush=True)

    peak_before = matmul_peak()
    mesh = parallel.make_mesh(devices=jax.devices()[:1])
    tx = ts.make_optimizer(ts.OptimizerConfig(learning_rate=1e-5))
    results = time_layouts({"packed": packed, "padded": padded}, model, mesh, tx, args.repeats)
    peak_after = matmul_peak()
    peak = {k: max(peak_before[k], peak_after[k]) for k in peak_before}
    flops = useful_flops(packed, config, matmul_params)
    packed_r, padded_r = results["packed"], results["padded"]
    summary = dict(
        speedup_tokens_per_s=packed_r["tokens_per_s"] / padded_r["tokens_per_s"],
        speedup_tokens_per_cpu_s=packed_r["tokens_per_cpu_s"] / padded_r["tokens_per_cpu_s"],
        packed_efficiency=packed_r["efficiency"],
        padded_efficiency=padded_r["efficiency"],
        packed_model_flops_per_s=flops / packed_r["step_s"],
        matmul_peak_flops_per_s=peak["flops_per_s"],
        packed_fraction_of_peak=flops / packed_r["step_s"] / peak["flops_per_s"],
        packed_model_flops_per_cpu_s=flops / packed_r["step_cpu_s"],
        matmul_peak_flops_per_cpu_s=peak["flops_per_cpu_s"],
        packed_fraction_of_peak_cpu_time=(flops / packed_r["step_cpu_s"]
                                          / peak["flops_per_cpu_s"]),
    )
    report = dict(
        summary=summary, layouts=list(results.values()),
        setup=dict(params=total_params, matmul_params=matmul_params, model=model_kw,
                   planners=args.planners, sequences=len(seqs), repeats=args.repeats,
                   planner_lengths=[len(s) for s in seqs if s.role_id == 0],
                   worker_lengths=[len(s) for s in seqs if s.role_id == 1],
                   micro_batch=(f"{args.rows_per_micro} rows per micro-batch" if args.rows_per_micro else "whole batch in one micro-batch") + ", both layouts", devices=1,
                   step_flops_useful=flops),
        machine=dict(cpus=os.cpu_count(), platform=platform.platform(),
                     jax=jax.__version__, loadavg_start=load_start, loadavg_end=os.getloadavg(),
                     matmul_peak_before=peak_before, matmul_peak_after=peak_after),
    )
    print(json.dumps(summary, indent=2))
    if not args.quick:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "train_step.json").write_text(json.dumps(report, indent=2) + "\n")
        (RESULTS / "train_step.md").write_text(markdown(report))


def markdown(report) -> str:
    s, setup, machine = report["summary"], report["setup"], report["machine"]
    lines = [
        "# Train step: packed vs padded",
        "",
        f"Qwen3-shaped model, {setup['params'] / 1e6:.1f}M parameters, float32, 1 CPU device "
        f"({machine['cpus']} cores, load average {machine['loadavg_start'][0]:.1f} at start, "
        f"{machine['loadavg_end'][0]:.1f} at end; the machine is shared).",
        f"{setup['planners']} planner rollouts ({min(setup['planner_lengths'])}-"
        f"{max(setup['planner_lengths'])} tokens) and {len(setup['worker_lengths'])} worker "
        f"rollouts ({min(setup['worker_lengths'])}-{max(setup['worker_lengths'])} tokens); "
        "the same micro-batching in both layouts (see json). Step times are the best of "
        f"{setup.get('repeats', 1)} steps, the layouts' steps interleaved. Produced by `python benchmarks/train_step.py`.",
        "",
        "| layout | rows x len | packing efficiency | tokens | step (s) | step (CPU s) "
        "| tokens/s | tokens/CPU s | loss tokens/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["layouts"]:
        lines.append(f"| {r['layout']} | {r['rows']} x {r['row_len']} | {r['efficiency']:.3f} | "
                     f"{r['tokens']} | {r['step_s']:.2f} | {r['step_cpu_s']:.2f} | "
                     f"{r['tokens_per_s']:.1f} | {r['tokens_per_cpu_s']:.1f} | "
                     f"{r['loss_tokens_per_s']:.1f} |")
    lines += [
        "",
        f"- packed / padded trained tokens/s: **{s['speedup_tokens_per_s']:.2f}x** wall clock, "
        f"{s['speedup_tokens_per_cpu_s']:.2f}x per CPU second (target >= 2x)",
        f"- packing efficiency: packed **{s['packed_efficiency']:.3f}** (target >= 0.95), "
        f"padded {s['padded_efficiency']:.3f}",
        f"- packed step model FLOPs (6 x matmul params x tokens + causal attention within "
        f"segments): {s['packed_model_flops_per_s'] / 1e9:.1f} GFLOP/s wall = "
        f"**{100 * s['packed_fraction_of_peak']:.0f}%** of the best-call float32 matmul peak "
        f"({s['matmul_peak_flops_per_s'] / 1e9:.1f} GFLOP/s); per CPU second "
        f"{s['packed_model_flops_per_cpu_s'] / 1e9:.1f} vs "
        f"{s['matmul_peak_flops_per_cpu_s'] / 1e9:.1f} GFLOP = "
        f"**{100 * s['packed_fraction_of_peak_cpu_time']:.0f}%** (target >= 40%)",
        "- Wall-clock figures depend on the other load on this shared machine (load average "
        "above); the per-CPU-second figures divide out time the process was not running.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
