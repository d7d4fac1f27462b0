"""A short run of the shrunk synthetic_tiny config in any checkout of this repository, reduced to
the numbers a refactoring must not move: the loss of every SFT and RL step and the evaluation
table. Run it on two commits on one machine and compare (same machine: XLA's float rounding
differs across CPUs).

    python benchmarks/short_run.py --checkout=. --out=/tmp/after.json
    git worktree add /tmp/before 7427cf1
    python benchmarks/short_run.py --checkout=/tmp/before --out=/tmp/before.json
    python benchmarks/short_run.py --compare /tmp/before.json /tmp/after.json

The overrides are those of tests/run/test_end_to_end.py (one device, seconds per phase).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

OVERRIDES = [
    "model.arch.hidden_size=32", "model.arch.intermediate_size=64",
    "model.arch.num_hidden_layers=1", "model.arch.num_attention_heads=2",
    "model.arch.num_key_value_heads=1", "model.arch.head_dim=16",
    "data.num_entities=60", "data.num_questions=240", "data.max_hops=2", "data.batch_size=2",
    "rollout.group_size=2", "rollout.max_new_tokens_per_turn=24", "rollout.max_turns_planner=2",
    "rollout.max_turns_worker=2", "rollout.decode_slots=8",
    "sft.steps=8", "sft.num_demos=16", "sft.batch_size=2",
    "train.steps=3", "train.checkpoint_every=1", "train.eval_every=0",
    "train.async_checkpointing=false", "eval.num_questions=8",
]
# Per-step numbers compared between runs (whatever of them a commit logs).
STEP_KEYS = ("sft/loss", "loss", "reward/mean", "grad_norm", "trained_tokens")


def read_jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run(checkout: str, workdir: str) -> dict:
    checkout = os.path.abspath(checkout)
    env = dict(os.environ, PYTHONPATH=checkout, XLA_FLAGS="--xla_force_host_platform_device_count=1")
    overrides = ",".join(OVERRIDES + [f"data.data_dir={workdir}/tfds"])
    cmd = [sys.executable, "-m", "matpo_jax.train",
           f"--config={checkout}/configs/synthetic_tiny.py:{overrides}", f"--workdir={workdir}/run"]
    subprocess.run(cmd, cwd=checkout, env=env, check=True)
    commit = subprocess.run(["git", "-C", checkout, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    steps = {}
    for phase, path in (("sft", f"{workdir}/run/sft/metrics.jsonl"),
                        ("rl", f"{workdir}/run/metrics.jsonl")):
        for record in read_jsonl(path):
            values = {k: record[k] for k in STEP_KEYS if k in record}
            if values:
                steps[f"{phase}/{record['step']}"] = values
    with open(f"{workdir}/run/summary.json") as f:
        summary = json.load(f)
    evals = {tag: {k: v for k, v in summary[f"{tag}_eval"].items() if k.startswith("eval/")}
             for tag in ("sft", "final")}
    return {"commit": commit, "steps": steps, "eval": evals}


def compare(a: dict, b: dict) -> int:
    """Prints every number of both runs side by side; returns the count that differ."""
    differ = 0
    print(f"| step | metric | {a['commit']} | {b['commit']} |\n|---|---|---|---|")
    for step in sorted(set(a["steps"]) | set(b["steps"]), key=lambda s: (s.split("/")[0] != "sft", int(s.split("/")[1]))):
        for key in STEP_KEYS:
            x, y = a["steps"].get(step, {}).get(key), b["steps"].get(step, {}).get(key)
            if x is None and y is None:
                continue
            same = x == y
            differ += not same
            print(f"| {step} | {key} | {x} | {y} |{'' if same else ' DIFFERS'}")
    for tag in ("sft", "final"):
        for key in sorted(set(a["eval"][tag]) | set(b["eval"][tag])):
            x, y = a["eval"][tag].get(key), b["eval"][tag].get(key)
            same = x == y
            differ += not same
            print(f"| eval {tag} | {key} | {x} | {y} |{'' if same else ' DIFFERS'}")
    print(f"{differ} numbers differ")
    return differ


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", default=".")
    parser.add_argument("--out")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"))
    args = parser.parse_args()
    if args.compare:
        a, b = (json.load(open(p)) for p in args.compare)
        sys.exit(1 if compare(a, b) else 0)
    with tempfile.TemporaryDirectory() as workdir:
        result = run(args.checkout, workdir)
    text = json.dumps(result, indent=1, sort_keys=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
