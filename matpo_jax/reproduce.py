"""Miniature reproduction of the paper's table: single-agent GRPO vs MATPO (and ablations), several
noise levels and seeds, from the SAME SFT starting point with the same RL budget; writes a markdown
table and curves.

    python -m matpo_jax.reproduce --out=docs/repro                         # the full grid
    python -m matpo_jax.reproduce --out=/tmp/r --noise=0.3 --seeds=0 --variants=matpo,single

Per noise level, one SFT-only run (`train.steps=0`) learns both ways of working from demonstrations
of both (`sft.modes=matpo+single`); every method and seed then starts RL from its checkpoint
(`sft.init_checkpoint`). Each run is `python -m matpo_jax.train --config=configs/synthetic_repro.py:
<args>` in its own workdir, so an interrupted grid resumes: finished runs are skipped, a killed one
continues from its last checkpoint. The table reports test-split accuracy (mean +- std over seeds),
overall and per hop.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
from absl import app, flags

from matpo_jax.report import compare

_OUT = flags.DEFINE_string("out", "docs/repro", "Where runs, table and plots go.")
_NOISE = flags.DEFINE_list("noise", ["0.05", "0.3"], "Noise levels of the world.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds per setting.")
_VARIANTS = flags.DEFINE_list("variants", ["single", "matpo", "matpo_no_recap", "matpo_no_summary"],
                              "Methods to run.")
_ABLATIONS_AT = flags.DEFINE_list("ablations_at", ["0.05"],
                                   "Noise levels where the ablation variants run (each costs a "
                                   "full run per seed).")
_ABLATION_SEEDS = flags.DEFINE_list("ablation_seeds", None,
                                     "Seeds of the ablation variants (default: --seeds).")
_OVERRIDES = flags.DEFINE_string("overrides", "", "Extra config overrides for every run (a=b,c=d).")

VARIANTS = {  # name -> synthetic_repro arguments
    "single": "mode=single",
    "matpo": "mode=matpo",
    "matpo_no_recap": "mode=matpo,recap=false",
    "matpo_no_summary": "mode=matpo,summary=false",
}
COMPARED = ("single", "matpo")  # run at every noise level and seed; the rest are ablations
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_one(workdir: str, arg: str, overrides: str) -> dict:
    summary_path = os.path.join(workdir, "summary.json")
    if not os.path.exists(summary_path):
        config = os.path.join(REPO, "configs", "synthetic_repro.py")
        command = [sys.executable, "-m", "matpo_jax.train", f"--config={config}:{arg}",
                   f"--workdir={workdir}"]
        command += [f"--config.{kv}" for kv in overrides.split(",") if kv]
        subprocess.run(command, check=True, cwd=REPO)
    with open(summary_path) as f:
        return json.load(f)


def shared_sft(out: str, noise: str, overrides: str) -> str:
    """The SFT checkpoint directory every run at this noise level starts from (trained once)."""
    workdir = os.path.join(out, "runs", f"sft_noise{noise}")
    run_one(workdir, f"mode=matpo,noise={noise},seed=0",
            ",".join(filter(None, [overrides, "sft.modes=matpo+single", "train.steps=0"])))
    return os.path.join(os.path.abspath(workdir), "checkpoints", "sft")


def table(results: dict, noises, hops_keys) -> str:
    head = "| noise | method | accuracy | " + " | ".join(k.split("_")[-1] for k in hops_keys) + " |"
    lines = [head, "|" + "---|" * (3 + len(hops_keys))]
    for noise in noises:
        for variant, runs in results[noise].items():
            cells = []
            for key in ["eval/accuracy", *hops_keys]:
                values = [100 * r["final_eval"].get(key, float("nan")) for r in runs]
                cells.append(f"{np.mean(values):.1f} ± {np.std(values):.1f}")
            sft = np.mean([100 * r["sft_eval"]["eval/accuracy"] for r in runs])
            lines.append(f"| {noise} | {variant} (SFT start {sft:.1f}; {len(runs)} seeds) | "
                         + " | ".join(cells) + " |")
    return "\n".join(lines)


def variants_at(noise: str, variants, ablations_at) -> list[str]:
    """The methods run at this noise level: the two compared methods everywhere, ablations only
    at the `ablations_at` noise levels."""
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise ValueError(f"--variants: unknown {unknown}; choose from {sorted(VARIANTS)}")
    return [v for v in variants if v in COMPARED or noise in ablations_at]


def seeds_of(variant: str, seeds, ablation_seeds) -> list[str]:
    """The seeds a method runs: ablations may run fewer (`--ablation_seeds`)."""
    if variant in COMPARED or ablation_seeds is None:
        return list(seeds)
    return list(ablation_seeds)


def main(argv):
    del argv
    os.makedirs(_OUT.value, exist_ok=True)
    results = {}
    # One world (dataset, corpus, tokenizer) per noise level, shared by the SFT and RL runs.
    shared = f"data.data_dir={os.path.abspath(os.path.join(_OUT.value, 'tfds'))}"
    base_overrides = ",".join(filter(None, [_OVERRIDES.value, shared]))
    for noise in _NOISE.value:
        results[noise] = {}
        start = shared_sft(_OUT.value, noise, base_overrides)
        overrides = ",".join([base_overrides, f"sft.init_checkpoint={start}"])
        methods = variants_at(noise, _VARIANTS.value, _ABLATIONS_AT.value)
        for variant in methods:
            runs = []
            for seed in seeds_of(variant, _SEEDS.value, _ABLATION_SEEDS.value):
                workdir = os.path.join(_OUT.value, "runs", f"{variant}_noise{noise}_seed{seed}")
                arg = f"{VARIANTS[variant]},noise={noise},seed={seed}"
                runs.append(run_one(workdir, arg, overrides))
            results[noise][variant] = runs
        curves = {v: [os.path.join(_OUT.value, "runs", f"{v}_noise{noise}_seed{s}", "metrics.jsonl")
                      for s in seeds_of(v, _SEEDS.value, _ABLATION_SEEDS.value)] for v in methods}
        compare.plot_comparison(curves, os.path.join(_OUT.value, f"curves_noise{noise}.png"),
                              keys=("reward/accuracy", "reward/mean", "loss"),
                              title=f"test-time noise {noise}: mean ± std over seeds")
    hops = sorted({k for n in results.values() for runs in n.values() for r in runs
                   for k in r["final_eval"] if k.startswith("eval/accuracy_hop")})
    text = "\n".join([
        "# Miniature reproduction: single-agent GRPO vs MATPO", "",
        f"Command: `python -m matpo_jax.reproduce --out={_OUT.value} --noise={','.join(_NOISE.value)} "
        f"--seeds={','.join(_SEEDS.value)} --variants={','.join(_VARIANTS.value)} "
        f"--ablations_at={','.join(_ABLATIONS_AT.value)}"
        + (f" --ablation_seeds={','.join(_ABLATION_SEEDS.value)}" if _ABLATION_SEEDS.value else "")
        + "`", "",
        "Evaluation accuracy (%) after RL, mean ± std over seeds; SFT start = before RL.", "",
        table(results, _NOISE.value, hops), ""])
    with open(os.path.join(_OUT.value, "README.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    app.run(main)
