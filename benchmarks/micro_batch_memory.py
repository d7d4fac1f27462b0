"""Peak host memory and time of one RL train step against rl.micro_batches, side by side in one run.

The packed RL batch grows with the rollouts (rl/batch.bucket_rows: pack_rows x 2^k rows), and the
train step's activations grow with the rows of one micro-batch. Each setting runs in its own
process (peak RSS only rises within a process): the demo's model (configs/synthetic_demo.py), a
batch of ROWS x rl.pack_len tokens, two calls of the jitted step (the first compiles).

    python benchmarks/micro_batch_memory.py                 # 128 rows, micro-batches 1 and 8
    python benchmarks/micro_batch_memory.py --rows=32 --micro=1,4 --out=-
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benchmarks", "results", "micro_batch_memory.json")


def one_setting(rows: int, micro: int) -> dict:
    """Runs in the child process: builds the demo's step and times two calls."""
    import jax
    import numpy as np
    from flax import nnx

    from matpo_jax.config import load_config_file, to_typed
    from matpo_jax.model import CausalLM
    from matpo_jax.run import runtime
    from matpo_jax.trainer import step as step_lib
    from matpo_jax.trainer.packing import PackedBatch

    cfg = to_typed(load_config_file(os.path.join(REPO, "configs", "synthetic_demo.py")))
    mesh = runtime.make_mesh(cfg)
    model = CausalLM(runtime.model_config(cfg.model), rngs=nnx.Rngs(0))
    scfg = dataclasses.replace(runtime.step_config(cfg, "rl"), micro_batches=micro)
    tx = step_lib.make_optimizer(runtime.optimizer_config(cfg, "rl"))
    graphdef, state, shardings = step_lib.init_train_state(model, tx, mesh)
    length = cfg.rl.pack_len
    rng = np.random.default_rng(0)
    full = lambda value, dtype: np.full((rows, length), value, dtype)
    batch = PackedBatch(
        tokens=rng.integers(0, cfg.model.arch.vocab_size, (rows, length)).astype(np.int32),
        positions=np.tile(np.arange(length, dtype=np.int32), (rows, 1)),
        segment_ids=full(1, np.int32), role_ids=full(0, np.int32),
        loss_mask=full(1.0, np.float32), advantages=full(1.0, np.float32),
        old_logprobs=full(-8.0, np.float32), loss_weights=full(1.0 / (rows * length), np.float32),
        rollout_ids=full(0, np.int32))
    run = step_lib.make_train_step(graphdef, tx, scfg, mesh, shardings)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        state = jax.block_until_ready(run(state, batch))[0]
        times.append(time.perf_counter() - start)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"rows": rows, "micro_batches": micro, "rows_per_micro_batch": rows // micro,
            "first_call_s": round(times[0], 1), "second_call_s": round(times[1], 1),
            "peak_rss_gb": round(peak_kb / 1e6, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--micro", default="1,8", help="micro-batch counts, comma-separated")
    parser.add_argument("--out", default=RESULTS, help="JSON file, or - to print only")
    parser.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_setting(*args.child)))
        return
    settings = []
    for micro in (int(m) for m in args.micro.split(",")):
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        env.pop("XLA_FLAGS", None)  # one CPU device, as `make demo` runs
        done = subprocess.run([sys.executable, __file__, "--child", str(args.rows), str(micro)],
                              env=env, capture_output=True, text=True, check=True)
        settings.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(settings[-1], flush=True)
    base = settings[0]
    for s in settings[1:]:
        print(f"micro-batches {s['micro_batches']} vs {base['micro_batches']}: peak RSS "
              f"{s['peak_rss_gb'] / base['peak_rss_gb']:.2f}x, step time "
              f"{s['second_call_s'] / base['second_call_s']:.2f}x")
    if args.out != "-":
        with open(args.out, "w") as f:
            json.dump({"machine": f"{platform.processor() or platform.machine()}, "
                                  f"{os.cpu_count()} CPUs", "config": "configs/synthetic_demo.py",
                       "settings": settings}, f, indent=1)


if __name__ == "__main__":
    main()
