"""The paper's comparison on the real model (configs/smollm2_repro.py): MATPO vs a single agent
from SmolLM2-135M-Instruct at one noise level, one workdir per method and seed. Per method:
accuracy after its SFT and after its RL on the same validation questions, RL's paired gain; then
the gap MATPO - single after SFT and after RL, paired over the questions, and the part of the
final gap that RL produced (MATPO's RL gain minus the single agent's, paired per question:
paired.gain_difference). How often the context limit stopped the role that reads the pages
(the single agent, or a MATPO worker) bounds how much of the gap the limit itself explains.

    python benchmarks/smollm2_repro_runs.py --matpo=runs/sm2repro_matpo_s0 \
        --single=runs/sm2repro_single_s0 --out=benchmarks/results/smollm2_repro_noise0.6 \
        [--machine="Intel Xeon, 2 cores"]

Several seeds: comma-separated workdirs, in the same seed order for both methods. Writes OUT.json,
OUT.md and OUT_curve.png.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np

from matpo_jax.report.compare import compare_runs
from matpo_jax.run.eval import paired
from smollm2_runs import accuracy, phase_minutes, phase_times

METHODS = ("matpo", "single")
NAMES = {"matpo": "MATPO", "single": "single agent"}
# The role whose context holds the pages: a MATPO worker, or the single agent itself.
READER = {"matpo": "worker", "single": "single"}


def _json(path: Path) -> dict:
    with open(path) as f:
        return json.load(f)


def _evaluations(run: Path) -> tuple[Path, Path]:
    return run / "eval" / "sft_questions.jsonl", run / "eval" / "final_questions.jsonl"


def _reader_context(evaluation: dict, role: str) -> dict:
    return {"tokens_mean": evaluation.get(f"eval/context_tokens_mean/{role}"),
            "tokens_max": evaluation.get(f"eval/context_tokens_max/{role}"),
            "stopped_by_limit": evaluation.get(f"eval/finish_max_context_frac/{role}", 0.0),
            "answered": evaluation.get("eval/answered")}


def summarise(method: str, run: Path) -> dict:
    config = _json(run / "config.json")
    if config["rollout"]["mode"] != method:
        raise SystemExit(f"{run}: rollout.mode is {config['rollout']['mode']!r}, given as "
                         f"--{method}")
    sft, final = _json(run / "eval" / "sft.json"), _json(run / "eval" / "final.json")
    gains = paired.compare(*_evaluations(run), by="hops")
    return {"run": str(run), "seed": config["train"]["seed"], "noise": config["data"]["noise"],
            "max_context": config["rollout"]["max_context"],
            "after_sft": accuracy(sft), "after_rl": accuracy(final),
            "rl_gain": {k: g.as_dict() for k, g in gains.items()},
            "context_after_sft": _reader_context(sft, READER[method]),
            "context_after_rl": _reader_context(final, READER[method]),
            "worker_calls_after_rl": final.get("eval/worker_calls_per_question"),
            "times": phase_times(run)}


def gaps(matpo: Path, single: Path) -> dict:
    """MATPO - single on the same questions after SFT and after RL, and RL's part of the change."""
    (m_sft, m_rl), (s_sft, s_rl) = _evaluations(matpo), _evaluations(single)
    return {"after_sft": paired.compare(s_sft, m_sft)["all"].as_dict(),
            "after_rl": paired.compare(s_rl, m_rl)["all"].as_dict(),
            "from_rl": paired.gain_difference((m_sft, m_rl), (s_sft, s_rl)).as_dict()}


def _points(g: dict) -> str:
    return (f"{100 * g['gain']:+.1f} ({100 * g['ci_low']:+.1f} to {100 * g['ci_high']:+.1f})"
            + ("" if g.get("mcnemar_p") is None else f", p {g['mcnemar_p']:.2g}"))


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def markdown(rows: dict, gap_rows: list[dict], machine: str, commit: str) -> str:
    first = rows["matpo"][0]
    lines = ["| method | seed | after SFT | after RL | RL gain (95% interval), McNemar p | "
             "1 hop / 2 hops after RL | pages' context after RL: mean tokens, stopped by the "
             "limit | run time | SFT / eval / RL / eval |",
             "|---|---|---:|---:|---|---|---|---:|---|"]
    for method in METHODS:
        for r in rows[method]:
            t, c, a = r["times"], r["context_after_rl"], r["after_rl"]
            lines.append(
                f"| {NAMES[method]} | {r['seed']} | {_pct(r['after_sft']['all'])} | "
                f"{_pct(a['all'])} | {_points(r['rl_gain']['all'])} | "
                f"{_pct(a.get('hops=1'))} / {_pct(a.get('hops=2'))} | "
                f"{READER[method]}: {c['tokens_mean'] or 0:.0f}, {_pct(c['stopped_by_limit'])} | "
                f"{(t['total_s'] or 0) / 60:.0f} min | {phase_minutes(t)} min |")
    gap_lines = ["| seed | MATPO - single after SFT | after RL | of which RL (MATPO's RL gain - "
                 "the single agent's) |", "|---|---|---|---|"]
    for r, g in zip(rows["matpo"], gap_rows):
        gap_lines.append(f"| {r['seed']} | {_points(g['after_sft'])} | {_points(g['after_rl'])} "
                         f"| {_points(g['from_rl'])} |")
    return (f"# MATPO vs a single agent from SmolLM2-135M-Instruct (configs/smollm2_repro.py)\n\n"
            f"Machine: {machine}. Commit {commit}, {time.strftime('%Y-%m-%d')}. Noise "
            f"{first['noise']}, context {first['max_context']} tokens for every role; "
            f"{first['rl_gain']['all']['questions']} validation questions, greedy, exact match; "
            f"both methods from the same pretrained model with the same SFT and RL budgets, each "
            f"SFT demonstrating its own way of working.\n\n" + "\n".join(lines) + "\n\n"
            "The gap, paired over the same questions (points; the last column is the change of "
            "the gap from after SFT to after RL, its interval over the per-question changes):"
            "\n\n" + "\n".join(gap_lines) + "\n\n"
            + "\n\n".join(f"{NAMES[m]}, seed {r['seed']}, RL's gain by hop count:\n\n"
                          + paired.markdown_table({k: paired.PairedGain(**g)
                                                   for k, g in r["rl_gain"].items()})
                          for m in METHODS for r in rows[m]) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for method in METHODS:
        parser.add_argument(f"--{method}", required=True,
                            help=f"comma-separated {NAMES[method]} workdirs, one a seed")
    parser.add_argument("--out", required=True, help="path prefix of the .json/.md/.png files")
    parser.add_argument("--machine", default="", help="what ran them (CPU, cores, load)")
    args = parser.parse_args()
    runs = {m: [Path(p) for p in getattr(args, m).split(",") if p] for m in METHODS}
    if len(runs["matpo"]) != len(runs["single"]):
        raise SystemExit(f"--matpo has {len(runs['matpo'])} runs, --single "
                         f"{len(runs['single'])}: one of each per seed")
    for run in runs["matpo"] + runs["single"]:
        for need in ("eval/sft_questions.jsonl", "eval/final_questions.jsonl", "metrics.jsonl"):
            if not (run / need).exists():
                raise SystemExit(f"{run}: no {need} (the run has not finished)")
    rows = {m: [summarise(m, run) for run in runs[m]] for m in METHODS}
    for m_row, s_row in zip(rows["matpo"], rows["single"]):
        if (m_row["seed"], m_row["noise"]) != (s_row["seed"], s_row["noise"]):
            raise SystemExit(f"{m_row['run']} and {s_row['run']}: not the same seed and noise")
    gap_rows = [gaps(m, s) for m, s in zip(runs["matpo"], runs["single"])]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump({"machine": args.machine, "commit": commit, "runs": rows, "gaps": gap_rows,
                   "mean_gap_after_rl": float(np.mean([g["after_rl"]["gain"] for g in gap_rows]))},
                  f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(markdown(rows, gap_rows, args.machine, commit))
    compare_runs({f"{NAMES[m]} (SmolLM2-135M-Instruct)": [str(r / "metrics.jsonl")
                                                          for r in runs[m]] for m in METHODS},
                 args.out + "_curve.png",
                 title=f"MATPO vs a single agent from SmolLM2, noise {rows['matpo'][0]['noise']}")
    print(open(args.out + ".md").read())


if __name__ == "__main__":
    main()
