"""The validation curve: accuracy on one fixed set of validation questions against the RL step.

Every `train.eval_every` RL steps (the evaluation of run/rl.py's step) the policy answers the first
`eval.curve_questions` questions of `eval.split`, the same ones every time, and that step's
metrics record gets their `curve/...` metrics (accuracy, per hop count, reward, answered, tool
use). Those questions are also the first ones of every full evaluation (world.eval_records),
so the evaluations after SFT (step 0) and after RL (the last step) report the same `curve/...`
metrics at no extra rollout: the curve runs from the SFT start to the end of RL on one question
set, at the cost of the evaluations in between only.

With eval.curve_questions = 0, or without the synthetic world in eval.datasets (benchmarks are
evaluated whole), the evaluations every train.eval_every steps are full ones (`eval/...` at the
step), as before the curve existed.
"""
from __future__ import annotations

from typing import Mapping

from matpo_jax.config import EvalSection
from matpo_jax.data import loader as loader_lib
from matpo_jax.run.eval.registry import evaluate_with, run_policy
from matpo_jax.run.eval.world import WorldEvaluator, eval_records, eval_selection
from matpo_jax.run.runtime import Runtime


def curve_selection(eval_cfg: EvalSection, split_sizes: Mapping[str, int]) -> tuple[str, int]:
    """(split, count) of the curve's questions: the first eval.curve_questions of the evaluated
    ones (count 0: no curve)."""
    split, evaluated = eval_selection(eval_cfg, split_sizes)
    return split, min(eval_cfg.curve_questions, evaluated)


def curve_size(rt: Runtime) -> int:
    """How many questions the run's validation curve evaluates (0: none; always none when the
    synthetic world is not evaluated: benchmarks are evaluated whole)."""
    if not rt.cfg.eval.curve_questions or loader_lib.SYNTHETIC not in rt.cfg.eval.datasets:
        return 0
    split = rt.cfg.eval.split
    return curve_selection(rt.cfg.eval, {split: len(rt.assets.source(split))})[1]


def evaluate_curve(rt: Runtime, graphdef, model_state, *, tag: str) -> dict[str, float]:
    """The `curve/...` metrics of the policy `model_state` on the curve's questions (the
    evaluation's files in <workdir>/eval/<tag>.json and <tag>_samples.txt)."""
    records = eval_records(rt, limit=curve_size(rt))
    return evaluate_with(rt, tag, [WorldEvaluator(rt, records, prefix="curve/")],
                         run_policy(rt, graphdef, model_state))
