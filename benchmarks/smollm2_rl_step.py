"""SmolLM2's RL train step against its micro-batch split and remat policy, side by side in one run.

A MATPO step of configs/smollm2_synthetic.py packs its rollouts into `pack_rows x 2^k` rows of
2,048 tokens (rl/batch.bucket_rows), e.g. 9 rows of tokens in a bucket of 16. The train step
splits the bucket into `rl.micro_batches` micro-batches and skips the all-padding ones
(packing.fill_micro_batches_first), so both the compute spent on padding rows and the peak
memory follow the rows of one micro-batch. Each setting runs in its own process (peak RSS only
rises within a process) on the real weights (models/smollm2-135m-instruct, `make smollm2`): the
same packed batch of USED rows of real token ids (random, not English: the step's cost does not
depend on which ids) inside a bucket of ROWS rows; a compile call, then the timed calls.

    python benchmarks/smollm2_rl_step.py    # ~10 min on a 2-core CPU; writes
                                            # benchmarks/results/smollm2_rl_step.{json,md}
    python benchmarks/smollm2_rl_step.py --settings=4:full,16:full --repeats=1 --out=-
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
RESULTS = os.path.join(REPO, "benchmarks", "results", "smollm2_rl_step")
CONFIG = os.path.join(REPO, "configs", "smollm2_synthetic.py")


def one_setting(rows: int, used: int, micro: int, remat: str, repeats: int) -> dict:
    """Runs in the child process: the config's RL step with `micro` micro-batches and `remat`."""
    import jax
    import numpy as np

    from matpo_jax import parallel
    from matpo_jax.config import load_config_file, to_typed
    from matpo_jax.model import load_pretrained
    from matpo_jax.run import runtime
    from matpo_jax.trainer import packing
    from matpo_jax.trainer import step as step_lib
    from matpo_jax.trainer.packing import PackedBatch

    cfg = to_typed(load_config_file(CONFIG))
    mesh = runtime.make_mesh(cfg)
    model = load_pretrained(cfg.model.hf_checkpoint, dtype="float32")
    scfg = dataclasses.replace(runtime.step_config(cfg, "rl"), micro_batches=micro, remat=remat)
    tx = step_lib.make_optimizer(runtime.optimizer_config(cfg, "rl"))
    graphdef, state, shardings = step_lib.init_train_state(model, tx, mesh)
    length = cfg.rl.pack_len
    rng = np.random.default_rng(0)
    live = (np.arange(rows) < used)[:, None]  # the first USED rows hold tokens, as packed
    shape = (rows, length)
    # Four ~512-token sequences a row, as a planner and its workers pack.
    segment = np.where(live, 1 + np.arange(length)[None] // 512, 0).astype(np.int32)
    positions = np.where(live, np.arange(length)[None] % 512, 0).astype(np.int32)
    tokens = np.where(live, rng.integers(0, cfg.model.arch.vocab_size, shape), 0)
    loss_mask = (live & (positions > 256)).astype(np.float32)  # ~half the tokens are responses
    batch = PackedBatch(
        tokens=tokens.astype(np.int32), positions=positions, segment_ids=segment,
        role_ids=np.zeros(shape, np.int32), loss_mask=loss_mask,
        advantages=np.where(live, rng.normal(size=(rows, 1)), 0).astype(np.float32) * loss_mask,
        old_logprobs=np.full(shape, -2.0, np.float32),
        loss_weights=loss_mask / loss_mask.sum(), rollout_ids=segment.copy())
    batch = packing.fill_micro_batches_first(batch, 1, micro)
    run = step_lib.make_train_step(graphdef, tx, scfg, mesh, shardings)
    start = time.perf_counter()
    batch = jax.device_put(batch, parallel.batch_sharding(mesh))
    compiled = run.jitted.lower(state, batch).compile()
    compile_s = time.perf_counter() - start
    memory = compiled.memory_analysis()
    temp_gb = None if memory is None else memory.temp_size_in_bytes / 1e9
    times, losses = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        state, metrics = jax.block_until_ready(compiled(state, batch))
        times.append(time.perf_counter() - start)
        losses.append(float(metrics["loss"]))
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"rows": rows, "used_rows": used, "micro_batches": micro, "remat": remat,
            "rows_per_micro_batch": rows // micro, "compile_s": round(compile_s, 1),
            "step_s": round(min(times), 1),
            "tokens_per_s": round(used * length / min(times), 1),
            "temp_gb": None if temp_gb is None else round(temp_gb, 2),
            "peak_rss_gb": round(peak_kb / 1e6, 2), "first_loss": losses[0]}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        return names[0] if names else platform.machine()
    except OSError:
        return platform.machine()


def markdown(result: dict) -> str:
    base = result["settings"][0]
    lines = [f"# SmolLM2's RL train step: micro-batches and remat ({result['machine']}, "
             f"{result['date']}, commit {result['commit']})", "",
             f"{base['used_rows']} rows of tokens in a bucket of {base['rows']} x "
             f"{result['row_length']}; `{result['command']}`", "",
             "| micro-batches | rows each | remat | step s | vs first | positions/s | "
             "compiled temporaries GB | peak RSS GB |", "|---:|---:|---|---:|---:|---:|---:|---:|"]
    for s in result["settings"]:
        lines.append(f"| {s['micro_batches']} | {s['rows_per_micro_batch']} | {s['remat']} | "
                     f"{s['step_s']} | {s['step_s'] / base['step_s']:.2f}x | {s['tokens_per_s']} "
                     f"| {s['temp_gb']} | {s['peak_rss_gb']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16, help="the packed bucket's rows")
    parser.add_argument("--used", type=int, default=9, help="rows holding tokens")
    parser.add_argument("--settings", default="4:full,16:full,16:dots,16:none",
                        help="micro-batches:remat pairs, comma-separated (the first is the base)")
    parser.add_argument("--repeats", type=int, default=1, help="timed calls (after an ahead-of-time compile)")
    parser.add_argument("--out", default=RESULTS, help="results path stem, or - to print only")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        rows, used, micro, remat, repeats = args.child
        print(json.dumps(one_setting(int(rows), int(used), int(micro), remat, int(repeats))))
        return
    settings = []
    for pair in args.settings.split(","):
        micro, remat = pair.split(":")
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        env.pop("XLA_FLAGS", None)  # one CPU device, as a run on this machine
        done = subprocess.run([sys.executable, __file__, "--child", str(args.rows),
                               str(args.used), micro, remat, str(args.repeats)],
                              env=env, capture_output=True, text=True)
        if done.returncode:
            print(done.stderr[-3000:], file=sys.stderr)
            settings.append({"micro_batches": int(micro), "remat": remat, "failed": True})
            continue
        settings.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(settings[-1], flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                            capture_output=True, text=True).stdout.strip()
    result = {"machine": f"{_cpu_model()}, {os.cpu_count()} CPUs",
              "date": time.strftime("%Y-%m-%d"), "commit": commit,
              "command": "python benchmarks/smollm2_rl_step.py " + " ".join(sys.argv[1:]),
              "row_length": 2048, "settings": [s for s in settings if not s.get("failed")]}
    print(markdown(result))
    if args.out != "-":
        with open(args.out + ".json", "w") as f:
            json.dump(result, f, indent=1)
        with open(args.out + ".md", "w") as f:
            f.write(markdown(result))


if __name__ == "__main__":
    main()
