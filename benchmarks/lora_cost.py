"""Full fine-tuning vs shared LoRA vs per-role LoRA, side by side in one run: train-state bytes
(trained parameters, optimizer state, frozen base), the train step's time (forward + backward +
AdamW update on one packed batch mixing planner and worker tokens) and one decode step's time
(slots mixing planner and worker rows). Repeats of the three are interleaved; medians reported.

    python benchmarks/lora_cost.py            # writes benchmarks/results/lora_cost.{json,md}
    python benchmarks/lora_cost.py --quick    # smaller shapes, fewer repeats, writes nothing
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from matpo_jax import parallel
from matpo_jax.config import RLSection
from matpo_jax.model import CausalLM, DecoderConfig, init_cache
from matpo_jax.model import lora as lora_lib
from matpo_jax.run.runtime import loss_config
from matpo_jax.trainer import step as step_lib
from matpo_jax.trainer.packing import PackedBatch

RESULTS = Path(__file__).parent / "results"
# configs/synthetic_tiny.py's model (the demo's)
MODEL = dict(vocab_size=1024, hidden_size=128, intermediate_size=384, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32)
VARIANTS = ("full", "shared", "per_role")


def build(variant: str, rank: int):
    model = CausalLM(DecoderConfig(**MODEL), rngs=nnx.Rngs(0))
    if variant != "full":
        lora_lib.add_adapters(model, lora_lib.LoRAConfig(rank=rank, alpha=2.0 * rank,
                                                         roles=variant))
    return model


def packed_batch(rows: int, length: int, seed: int = 0) -> PackedBatch:
    """Rows of two segments each: a planner half and a worker half, every token trained."""
    rng = np.random.default_rng(seed)
    half = length // 2
    positions = np.tile(np.concatenate([np.arange(half), np.arange(length - half)]), (rows, 1))
    segments = np.tile(np.repeat([1, 2], [half, length - half]), (rows, 1))
    roles = np.tile(np.repeat([0, 1], [half, length - half]), (rows, 1))
    shape = (rows, length)
    mask = np.ones(shape, np.float32)
    mask[:, [0, half]] = 0
    return PackedBatch(tokens=rng.integers(1, MODEL["vocab_size"], shape).astype(np.int32),
                       positions=positions.astype(np.int32), segment_ids=segments.astype(np.int32),
                       role_ids=roles.astype(np.int32), loss_mask=mask,
                       advantages=rng.standard_normal(shape).astype(np.float32),
                       old_logprobs=-np.abs(rng.standard_normal(shape)).astype(np.float32),
                       loss_weights=mask / mask.sum(), rollout_ids=segments.astype(np.int32))


def nbytes(tree) -> int:
    return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rank", type=int, default=16)
    args = parser.parse_args()
    rows, length, slots, cache_len, repeats = ((4, 128, 8, 256, 3) if args.quick
                                               else (8, 256, 32, 512, 7))
    mesh = parallel.make_mesh(devices=jax.devices()[:1])
    tx = step_lib.make_optimizer(step_lib.OptimizerConfig(learning_rate=1e-4))
    config = step_lib.TrainStepConfig(loss=loss_config(RLSection()))  # the default loss
    batch = packed_batch(rows, length)
    runs, sizes = {}, {}
    for variant in VARIANTS:
        graphdef, state, shardings = step_lib.init_train_state(build(variant, args.rank), tx, mesh)
        step = step_lib.make_train_step(graphdef, tx, config, mesh, shardings)
        sizes[variant] = {"trained_bytes": nbytes(state.params),
                          "optimizer_bytes": nbytes(state.opt_state),
                          "frozen_bytes": nbytes(state.frozen)}
        model = nnx.merge(graphdef, state.params, state.frozen)
        decode_graph, decode_state = nnx.split(model)
        decode_state = jax.tree.map(jnp.copy, decode_state)  # the train step donates its state
        decode = jax.jit(lambda s, t, c, a, r, g=decode_graph: nnx.merge(g, s).decode(t, c, a, r))
        cache = init_cache(model.config, slots, cache_len)._replace(
            lengths=jnp.full((slots,), cache_len // 2, jnp.int32))
        tokens = jnp.ones((slots,), jnp.int32)
        roles = jnp.arange(slots, dtype=jnp.int32) % 2  # planner and worker slots alternate
        active = jnp.ones((slots,), bool)
        runs[variant] = dict(step=step, state=state, decode=decode, decode_state=decode_state,
                             cache=cache, tokens=tokens, roles=roles, active=active)
        state, _ = step(state, batch)  # compile
        jax.block_until_ready(state)
        runs[variant]["state"] = state
        jax.block_until_ready(decode(decode_state, tokens, cache, active, roles))
    times = {v: {"train_step_s": [], "decode_step_s": []} for v in VARIANTS}
    for _ in range(repeats):
        for variant in VARIANTS:
            r = runs[variant]
            t0 = time.perf_counter()
            r["state"], metrics = r["step"](r["state"], batch)
            jax.block_until_ready(metrics)
            times[variant]["train_step_s"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            jax.block_until_ready(r["decode"](r["decode_state"], r["tokens"], r["cache"],
                                              r["active"], r["roles"]))
            times[variant]["decode_step_s"].append(time.perf_counter() - t0)
    result = {"machine": platform.processor() or platform.machine(), "model": MODEL,
              "rank": args.rank, "batch": [rows, length], "slots": slots, "cache_len": cache_len,
              "repeats": repeats, "sizes": sizes,
              "median_s": {v: {k: float(np.median(x)) for k, x in t.items()}
                           for v, t in times.items()}}
    base = result["median_s"]["full"]
    result["ratio_to_full"] = {v: {k: m[k] / base[k] for k in m}
                               for v, m in result["median_s"].items()}
    print(json.dumps(result, indent=1))
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "lora_cost.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
