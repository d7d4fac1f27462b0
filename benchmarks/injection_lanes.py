"""The demo's own rollouts under several `rollout.injection_lanes`: wall time and the tokens.

One RL step's batch (the first 32 questions of the RL stream, 8 samples each) rolled out by a run's
SFT checkpoint, once per lane setting, the settings alternating in every repeat so that load from
other processes hits them alike. Each setting's tokens are compared with the first one's (they
must be equal: lanes change how injections are batched, not what is sampled) and its log-probs
give the largest difference (float rounding of differently shaped extends).

    .venv/bin/python benchmarks/injection_lanes.py --run=runs/demo --lanes=4,1
    # writes benchmarks/results/injection_lanes.{json,md}; needs the run's SFT checkpoint
"""
from __future__ import annotations

import argparse
import os
import pathlib
import platform
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from demo_run import first_step, machine_line, write_result  # noqa: E402
from matpo_jax.agents.rollout import EngineOptions  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", default="runs/demo", help="a finished run (its SFT checkpoint "
                        "and world)")
    parser.add_argument("--config", default="configs/synthetic_demo.py")
    parser.add_argument("--lanes", default="4,1", help="settings to compare, the first the "
                        "reference for tokens")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "injection_lanes"))
    args = parser.parse_args()
    lanes = [int(x) for x in args.lanes.split(",")]
    started = time.perf_counter()
    with first_step(args.run, args.config) as step:
        cfg, questions = step.cfg, step.questions["question"]
        rows, reference = {n: dict(lanes=n, seconds=[]) for n in lanes}, None
        for repeat in range(args.repeats + 1):  # the first pass compiles
            for n in lanes:
                start = time.perf_counter()
                batch = step.rollouts(EngineOptions(injection_lanes=n))
                seconds = time.perf_counter() - start
                row = rows[n]
                if repeat:
                    row["seconds"].append(seconds)
                else:
                    row["first_call_s"] = seconds
                tokens = [r.tokens for r in batch.rollouts]
                logprobs = [np.asarray(r.logprobs) for r in batch.rollouts]
                if reference is None:
                    reference = (tokens, logprobs)
                row["same_tokens"] = tokens == reference[0]
                row["max_abs_logprob_diff"] = max(
                    (float(np.abs(a - b).max()) for a, b in zip(logprobs, reference[1])
                     if len(a) and len(a) == len(b)), default=0.0)
                for key in ("extend_positions", "decode_steps", "host_calls", "sampled_tokens"):
                    row[key] = int(batch.metrics[key])
                print(f"repeat {repeat} lanes {n}: {seconds:.1f} s", flush=True)
    for row in rows.values():
        row["median_s"] = statistics.median(row["seconds"])
    base = rows[lanes[0]]["median_s"]
    for row in rows.values():
        row["speedup_vs_first"] = base / row["median_s"]
    result = dict(benchmark="the demo's rollouts (one RL step's batch) by rollout.injection_lanes",
                  run=args.run, config=args.config, questions=len(questions),
                  group_size=cfg.rollout.group_size, decode_slots=cfg.rollout.decode_slots,
                  repeats=args.repeats, statistic="median", rows=list(rows.values()),
                  machine=platform.processor() or platform.machine(), cpus=os.cpu_count(),
                  jax=jax.__version__, load_average=[round(x, 2) for x in os.getloadavg()],
                  total_s=time.perf_counter() - started)
    write(result, args.out)


def write(result: dict, out: str) -> None:
    lines = [f"# {result['benchmark']}", "",
             f"`python benchmarks/injection_lanes.py --run={result['run']}`: {result['questions']} "
             f"questions x {result['group_size']} samples, {result['decode_slots']} decode slots, "
             f"median of {result['repeats']} interleaved repeats after a compiling pass; "
             + machine_line(result),
             "", "| lanes | seconds | speed-up | first call s | extend positions | decode steps "
             "| same tokens | max abs log-prob diff |", "|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['lanes']} | {r['median_s']:.1f} | {r['speedup_vs_first']:.2f}x | "
                     f"{r['first_call_s']:.1f} | {r['extend_positions']:,} | {r['decode_steps']:,} | "
                     f"{'yes' if r['same_tokens'] else 'NO'} | {r['max_abs_logprob_diff']:.1e} |")
    write_result(result, out, lines)


if __name__ == "__main__":
    main()
