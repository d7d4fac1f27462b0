"""`make demo`: the embedded default end to end, then a short table a person can read.

    python -m matpo_jax.demo --workdir=runs/demo [--config=configs/synthetic_tiny.py] \
        [--config.train.steps=10 ...]

Builds the synthetic research world, starts the local search service, warm-starts a tiny Qwen3 on
oracle demonstrations of both roles, trains it with MATPO, evaluates before and after RL, and
prints validation accuracy per hop count and tool use per question, plus where the plots are.
"""
from __future__ import annotations

import os
import sys
import time

from absl import app

from matpo_jax import config as config_lib
from matpo_jax.run.eval import paired

# The same command line as train (--config.a.b=v overrides, --allow_config_change, --verbose).
_RUN = config_lib.define_run_flags(default_config="configs/synthetic_demo.py",
                                   default_workdir="runs/demo")

ROWS = (("accuracy", "eval/accuracy"), ("  1 hop", "eval/accuracy_hop1"),
        ("  2 hops", "eval/accuracy_hop2"), ("  3 hops", "eval/accuracy_hop3"),
        ("  4 hops", "eval/accuracy_hop4"), ("answered", "eval/answered"),
        ("tool calls / question", "eval/tool_calls_per_question"),
        ("worker calls / question", "eval/worker_calls_per_question"))


def results_table(sft_eval: dict, final_eval: dict) -> str:
    """Markdown table: validation metrics after SFT and after RL, side by side."""
    lines = ["| validation | after SFT | after MATPO |", "|---|---|---|"]
    for label, key in ROWS:
        if key in sft_eval or key in final_eval:
            fmt = (lambda v: f"{100 * v:.1f}%") if "accuracy" in key or key == "eval/answered" \
                else (lambda v: f"{v:.2f}")
            cells = [fmt(d[key]) if key in d else "-" for d in (sft_eval, final_eval)]
            lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def paired_line(eval_dir: str) -> str:
    """The gain over the same questions, with its 95% interval and McNemar's test."""
    before, after = (os.path.join(eval_dir, f"{tag}_questions.jsonl") for tag in ("sft", "final"))
    if not (os.path.exists(before) and os.path.exists(after)):
        return "paired: no per-question results of both evaluations"
    g = paired.compare(before, after)["all"]
    test = "" if g.mcnemar_p is None else (
        f"; {g.wrong_to_right} wrong -> right, {g.right_to_wrong} right -> wrong, McNemar p = "
        f"{g.mcnemar_p:.2g}")
    return (f"gain {100 * g.gain:+.1f} points over the same {g.questions} questions (95% interval "
            f"{100 * g.ci_low:+.1f} to {100 * g.ci_high:+.1f}{test}); per hop count: "
            f"python -m matpo_jax.run.eval.paired --before={before} --after={after}")


@config_lib.one_line_errors
def main(argv):
    del argv
    _, workdir = _RUN.checked_start()
    cfg = _RUN.config_for_devices()
    from matpo_jax.run.experiment import run_experiment

    start = time.time()
    summary = run_experiment(cfg, workdir, allow_config_change=_RUN.allow_config_change.value)
    print()
    print(results_table(summary["sft_eval"], summary["final_eval"]))
    print(f"\nquestions: {int(summary['final_eval'].get('eval/questions', 0))} "
          f"({cfg.eval.split} split); wall time {time.time() - start:.0f} s")
    print(paired_line(os.path.join(summary["workdir"], "eval")))
    print(f"plots:   {os.path.join(summary['workdir'], 'plots')}")
    print(f"metrics: {os.path.join(summary['workdir'], 'metrics.jsonl')} (TensorBoard: "
          f"{os.path.join(summary['workdir'], 'tensorboard')})")


if __name__ == "__main__":
    sys.exit(app.run(main, flags_parser=config_lib.flags_parser))
