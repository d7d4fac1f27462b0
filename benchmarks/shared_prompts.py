"""The demo's RL update with and without shared prompts (`rl.share_prompts`), side by side.

One RL step's batch (a finished run's SFT policy rolling out the first 32 questions x 8 samples)
packed both ways, then the two passes over it that an RL step makes, alternating in every repeat
so that load from other processes hits both alike: the update's forward and backward over every
micro-batch (`trainer.step.make_gradient_fn`, what the train step differentiates) and the
log-prob pass of the KL reference (`make_logprob_fn`). Reports packed rows and positions, the
median seconds of each, and how far the shared layout's loss, gradient and per-rollout log-probs
are from the plain layout's.

    .venv/bin/python benchmarks/shared_prompts.py --run=runs/demo
    # writes benchmarks/results/shared_prompts.{json,md}; needs the run's SFT checkpoint
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import platform
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from demo_run import first_step, machine_line, write_result  # noqa: E402
from matpo_jax.data import loader as loader_lib  # noqa: E402
from matpo_jax.run import runtime  # noqa: E402
from matpo_jax.run.rl import rl_batch  # noqa: E402
from matpo_jax.trainer import step as step_lib  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAYOUTS = ("plain", "shared")


def per_rollout(batch, values) -> dict[int, np.ndarray]:
    """{rollout id: the values at its loss positions, in order}."""
    values, ids = np.asarray(values), np.asarray(batch.rollout_ids)
    mask = np.asarray(batch.loss_mask) != 0
    return {int(r): values[(ids == r) & mask] for r in np.unique(ids[ids >= 0])}


def timed(fn, *args):
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", default="runs/demo", help="a finished run (its SFT checkpoint "
                        "and world)")
    parser.add_argument("--config", default="configs/synthetic_demo.py")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "shared_prompts"))
    args = parser.parse_args()
    started = time.perf_counter()
    with first_step(args.run, args.config) as step:
        cfg, rt = step.cfg, step.rt
        rollouts = step.rollouts().rollouts
        scfg, loop = runtime.step_config(cfg, "rl"), step.loop
        state = loop.state  # the SFT parameters: the RL step's start
        golds = loader_lib.golds_of(step.questions)
        batches = {}
        for layout in LAYOUTS:
            layout_rt = with_share_prompts(rt, layout == "shared")
            batches[layout], metrics = rl_batch(layout_rt, rollouts, golds,
                                                step.questions["question"], scfg.loss,
                                                scfg.row_multiple(rt.mesh))
        grads_fn = step_lib.make_gradient_fn(loop.graphdef, scfg, rt.mesh, loop.shardings)
        logprob_fn = step_lib.make_logprob_fn(loop.graphdef, scfg, rt.mesh, loop.shardings)
        rows = {name: dict(layout=name, rows=int(b.shape[0]),
                           used_rows=int((np.asarray(b.segment_ids) > 0).any(axis=1).sum()),
                           positions=int((np.asarray(b.segment_ids) > 0).sum()),
                           update_s=[], logprob_s=[]) for name, b in batches.items()}
        outputs = {}
        for repeat in range(args.repeats + 1):  # the first pass compiles
            for name in LAYOUTS:
                batch = batches[name]
                logprob_s, logprobs = timed(logprob_fn, state.params, state.frozen, batch)
                if scfg.loss.kl_coef > 0:  # the step's reference: the policy itself here
                    batch = dataclasses.replace(batch, ref_logprobs=logprobs)
                update_s, (loss, grads, _) = timed(grads_fn, state, batch)
                if repeat:
                    rows[name]["update_s"].append(update_s)
                    rows[name]["logprob_s"].append(logprob_s)
                else:
                    rows[name].update(first_update_s=update_s, first_logprob_s=logprob_s)
                outputs[name] = (float(loss), grads, per_rollout(batch, logprobs))
                print(f"repeat {repeat} {name}: update {update_s:.1f} s, log-probs "
                      f"{logprob_s:.1f} s", flush=True)
    for row in rows.values():
        row["update_median_s"] = statistics.median(row["update_s"])
        row["logprob_median_s"] = statistics.median(row["logprob_s"])
    plain, shared = outputs["plain"], outputs["shared"]
    grad_diff = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                    for a, b in zip(jax.tree.leaves(plain[1]), jax.tree.leaves(shared[1])))
    grad_scale = max(float(np.abs(np.asarray(a)).max()) for a in jax.tree.leaves(plain[1]))
    logprob_diff = max(float(np.abs(plain[2][r] - shared[2][r]).max(initial=0.0))
                       for r in plain[2])
    result = dict(
        benchmark="the demo's RL update and KL reference pass, plain vs shared-prompt packing",
        run=args.run, config=args.config, questions=len(step.questions["question"]),
        group_size=cfg.rollout.group_size, micro_batches=cfg.rl.micro_batches,
        pack_len=cfg.rl.pack_len, kl_coef=cfg.rl.kl_coef, repeats=args.repeats,
        statistic="median",
        rows=[rows[name] for name in LAYOUTS],
        update_speedup=rows["plain"]["update_median_s"] / rows["shared"]["update_median_s"],
        logprob_speedup=rows["plain"]["logprob_median_s"] / rows["shared"]["logprob_median_s"],
        loss=dict(plain=plain[0], shared=shared[0]),
        max_abs_grad_diff=grad_diff, max_abs_grad=grad_scale,
        max_abs_logprob_diff=logprob_diff, same_rollouts=plain[2].keys() == shared[2].keys(),
        machine=platform.processor() or platform.machine(), cpus=os.cpu_count(),
        jax=jax.__version__, load_average=[round(x, 2) for x in os.getloadavg()],
        total_s=time.perf_counter() - started)
    write(result, args.out)


def with_share_prompts(rt, share: bool):
    """The runtime with rl.share_prompts set."""
    rl = dataclasses.replace(rt.cfg.rl, share_prompts=share)
    return dataclasses.replace(rt, cfg=dataclasses.replace(rt.cfg, rl=rl))


def write(result: dict, out: str) -> None:
    lines = [f"# {result['benchmark']}", "",
             f"`python benchmarks/shared_prompts.py --run={result['run']}`: {result['questions']} "
             f"questions x {result['group_size']} samples, rows of {result['pack_len']} tokens "
             f"in {result['micro_batches']} micro-batches, rl.kl_coef={result['kl_coef']} "
             f"(with a KL term every sequence is trained), median of {result['repeats']} "
             f"interleaved repeats after a compiling pass; " + machine_line(result), "",
             "| packing | rows (in use) | positions | update s | KL reference pass s |",
             "|---|---:|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['layout']} | {r['rows']} ({r['used_rows']}) | {r['positions']:,} | "
                     f"{r['update_median_s']:.2f} | {r['logprob_median_s']:.2f} |")
    lines += ["", f"Speed-up: update **{result['update_speedup']:.2f}x**, KL reference pass "
              f"**{result['logprob_speedup']:.2f}x**. Loss {result['loss']['plain']:.6f} plain, "
              f"{result['loss']['shared']:.6f} shared; largest gradient difference "
              f"{result['max_abs_grad_diff']:.1e} (largest gradient entry "
              f"{result['max_abs_grad']:.1e}); largest log-prob difference at a loss position "
              f"{result['max_abs_logprob_diff']:.1e}."]
    write_result(result, out, lines)


if __name__ == "__main__":
    main()
