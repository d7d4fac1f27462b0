"""The table of the real-model MATPO runs (configs/smollm2_synthetic.py, one workdir a seed):
accuracy after SFT and after MATPO on the same validation questions, the paired gain with its 95%
interval and McNemar's p, per hop count, each phase's wall time, the gain over all seeds (each
question's score averaged over them), and the validation curve PNG.

    python benchmarks/smollm2_runs.py --runs=runs/smollm2_s0,runs/smollm2_s1,runs/smollm2_s2 \
        --out=benchmarks/results/smollm2_synthetic [--machine="Intel Xeon, 2 cores, shared"]

Seeds past the first may start from the first's SFT (`sft.init_checkpoint`, its evaluation after
SFT copied in: the same parameters, greedy), as the miniature reproduction's seeds do; their row
says so and times only their own phases.

Writes OUT.json, OUT.md and OUT_curve.png. Times come from the runs' own metrics (the SFT loop's
first and last step, each RL step's logged time, the summary's write), so a resumed run's
pause is left out only when it lies between two logged steps.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

from matpo_jax.report.compare import compare_runs
from matpo_jax.report.metrics import read_records
from matpo_jax.run.eval import paired


def _json(path: Path) -> dict:
    with open(path) as f:
        return json.load(f)


def accuracy(evaluation: dict) -> dict:
    return {"all": evaluation["eval/accuracy"],
            **{f"hops={h}": evaluation[f"eval/accuracy_hop{h}"] for h in (1, 2)
               if f"eval/accuracy_hop{h}" in evaluation}}


def phase_times(run: Path) -> dict:
    """Seconds of SFT, RL (rollouts + updates + periodic curves) and the two full evaluations.
    A seed that starts from another run's SFT (`sft.init_checkpoint`, its evaluation copied in)
    has neither of its own: its time counts from its config's writing, the run's start."""
    sft_log = run / "sft" / "metrics.jsonl"
    sft = ([r["time"] for r in read_records(sft_log) if "time" in r]
           if sft_log.exists() else [])
    rl = [r for r in read_records(run / "metrics.jsonl") if "time" in r]
    after_sft = (run / "eval" / "sft.json").stat().st_mtime
    # A record holding a full evaluation is logged at the step it follows, after its rollouts.
    rl_steps = [r for r in rl if "time_update_s" in r and "eval/accuracy" not in r]
    final = (run / "eval" / "final.json").stat().st_mtime
    out = {"sft_s": sft[-1] - sft[0] if len(sft) > 1 else None,
           "eval_after_sft_s": after_sft - sft[-1] if sft else None,
           "rl_s": rl_steps[-1]["time"] - after_sft if rl_steps else None,
           "final_eval_s": final - rl_steps[-1]["time"] if rl_steps else None,
           "rl_step_s": [round(b - a, 1) for a, b in zip(
               [after_sft] + [r["time"] for r in rl_steps[:-1]], [r["time"] for r in rl_steps])],
           "update_s": [round(r["time_update_s"], 1) for r in rl_steps],
           "rollout_s": [round(r.get("time_rollout_s", float("nan")), 1) for r in rl_steps]}
    start = sft[0] if sft else (run / "config.json").stat().st_mtime
    if not sft and rl_steps:  # a shared start: the copied evaluation's time is not this run's
        out["rl_s"] = rl_steps[-1]["time"] - start
        out["rl_step_s"][0] = round(rl_steps[0]["time"] - start, 1)
    out["total_s"] = final - start
    return out


def phase_minutes(times: dict) -> str:
    """"14 / 18 / 37 / 19": SFT, evaluation after it, RL, final evaluation (- where not run)."""
    return " / ".join("-" if times[k] is None else f"{times[k] / 60:.0f}" for k in
                      ("sft_s", "eval_after_sft_s", "rl_s", "final_eval_s"))


def summarise(run: Path) -> dict:
    before, after = run / "eval" / "sft_questions.jsonl", run / "eval" / "final_questions.jsonl"
    gains = paired.compare(before, after, by="hops")
    config = _json(run / "config.json")
    return {"run": str(run), "seed": config["train"]["seed"],
            "shared_start": config["sft"]["init_checkpoint"],
            "after_sft": accuracy(_json(run / "eval" / "sft.json")),
            "after_matpo": accuracy(_json(run / "eval" / "final.json")),
            "paired": {k: g.as_dict() for k, g in gains.items()},
            "paired_table": paired.markdown_table(gains),
            "planner_calls_after": _json(run / "eval" / "final.json").get(
                "eval/worker_calls_per_question"),
            "times": phase_times(run)}


def _start_name(checkpoint: str) -> str:
    """runs/x/checkpoints/sft -> x: the run whose SFT a seed starts from."""
    return Path(checkpoint).parent.parent.name


def markdown(rows: list[dict], machine: str, commit: str, over_seeds: dict | None) -> str:
    head = ("| seed | after SFT | after MATPO | gain (95% interval) | wrong -> right / right -> "
            "wrong | McNemar p | 2 hops: SFT -> MATPO | run time | SFT / eval / RL / eval |")
    lines = [head, "|---|---:|---:|---|---|---:|---|---:|---|"]
    for r in rows:
        g, t = r["paired"]["all"], r["times"]
        two = r["paired"].get("hops=2")
        lines.append(
            f"| {r['seed']} | {100 * g['before']:.1f}% | {100 * g['after']:.1f}% | "
            f"{100 * g['gain']:+.1f} ({100 * g['ci_low']:+.1f} to {100 * g['ci_high']:+.1f}) | "
            f"{g['wrong_to_right']} / {g['right_to_wrong']} | {g['mcnemar_p']:.2g} | "
            + (f"{100 * two['before']:.1f}% -> {100 * two['after']:.1f}%" if two else "-")
            + f" | {(t['total_s'] or 0) / 60:.0f} min | {phase_minutes(t)} min"
            + (" (the SFT start of " + _start_name(r["shared_start"]) + ")"
               if r["shared_start"] else "") + " |")
    if over_seeds:
        g = over_seeds
        lines.append(
            f"| {len(rows)} seeds, each question averaged over them | {100 * g['before']:.1f}% | "
            f"{100 * g['after']:.1f}% | {100 * g['gain']:+.1f} ({100 * g['ci_low']:+.1f} to "
            f"{100 * g['ci_high']:+.1f}) | - | - | - | - | - |")
    return (f"# MATPO from SmolLM2-135M-Instruct (configs/smollm2_synthetic.py)\n\n"
            f"Machine: {machine}. Commit {commit}, {time.strftime('%Y-%m-%d')}. "
            f"{rows[0]['paired']['all']['questions']} validation questions, greedy, exact match; "
            f"the gain is paired over the same questions (over several seeds, each question's "
            f"score is its mean over the seeds, so the interval spans questions, not "
            f"question-seed pairs).\n\n" + "\n".join(lines) + "\n\n"
            + "\n\n".join(f"Seed {r['seed']} by hop count:\n\n{r['paired_table']}" for r in rows)
            + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", required=True, help="comma-separated workdirs, one a seed")
    parser.add_argument("--out", required=True, help="path prefix of the .json/.md/.png files")
    parser.add_argument("--machine", default="", help="what ran them (CPU, cores, load)")
    args = parser.parse_args()
    runs = [Path(p) for p in args.runs.split(",") if p]
    for run in runs:
        for need in ("eval/sft_questions.jsonl", "eval/final_questions.jsonl", "metrics.jsonl"):
            if not (run / need).exists():
                raise SystemExit(f"{run}: no {need} (the run has not finished)")
    rows = [summarise(run) for run in runs]
    over_seeds = paired.seed_mean_gain(
        [(run / "eval" / "sft_questions.jsonl", run / "eval" / "final_questions.jsonl")
         for run in runs]).as_dict() if len(runs) > 1 else None
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump({"machine": args.machine, "commit": commit, "runs": rows,
                   "over_seeds": over_seeds}, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(markdown(rows, args.machine, commit, over_seeds))
    compare_runs({"MATPO (SmolLM2-135M-Instruct)": [str(r / "metrics.jsonl") for r in runs]},
                 args.out + "_curve.png", title="MATPO from SmolLM2-135M-Instruct, validation")
    print(open(args.out + ".md").read())


if __name__ == "__main__":
    main()
