"""Evaluators by name: `eval.datasets` names the evaluations of a run, each built here for one
evaluation (tag) and run with the run's policy (one protocol, protocol.py).

    synthetic                          world.WorldEvaluator: eval.split, the training reward
    musique, frames, webwalkerqa, gaia benchmark.BenchmarkEvaluator: the benchmark's own split,
        its first eval.num_questions (0: all), one sample at eval.temperature, graded by
        reward.method, resumable, in <workdir>/eval/<tag>/<dataset>/ (results of other
        parameters there, e.g. an extended run's earlier "final", are set aside, never mixed in)

Every metric of one evaluation goes to <workdir>/eval/<tag>.json (report.py).
"""
from __future__ import annotations

from typing import Callable, Iterable

import jax

from matpo_jax.data import loader as loader_lib
from matpo_jax.run import provenance
from matpo_jax.run.eval import report
from matpo_jax.run.eval.benchmark import BenchmarkEvaluator
from matpo_jax.run.eval.collect import Policy
from matpo_jax.run.eval.grading import make_grader
from matpo_jax.run.eval.protocol import Evaluation, Evaluator
from matpo_jax.run.eval.questions import load_questions
from matpo_jax.run.eval.world import WorldEvaluator
from matpo_jax.run.runtime import Runtime, prefix_rows, rollout_config, tool_calls_per_turn

# (runtime, dataset name, tag, curve questions) -> the evaluator of that evaluation
EvaluatorFactory = Callable[[Runtime, str, str, int], Evaluator]
EVALUATORS: dict[str, EvaluatorFactory] = {}


def register(*names: str):
    def add(factory: EvaluatorFactory) -> EvaluatorFactory:
        for name in names:
            EVALUATORS[name] = factory
        return factory
    return add


@register(loader_lib.SYNTHETIC)
def _world(rt: Runtime, name: str, tag: str, curve_questions: int) -> Evaluator:
    return WorldEvaluator(rt, curve_questions=curve_questions)


@register(*(n for n in loader_lib.DATASET_NAMES if n != loader_lib.SYNTHETIC))
def _benchmark(rt: Runtime, name: str, tag: str, curve_questions: int) -> Evaluator:
    cfg = rt.cfg  # benchmarks are evaluated whole: no curve
    questions = load_questions(cfg, name, None, split=None, num_questions=cfg.eval.num_questions,
                               data_dir=rt.assets.data_dir)
    # What produced the answers in <workdir>/eval/<tag>/<name>/: this run at this tag, whose
    # parameters its config fixes up to its total steps (an extended run's "final" is another).
    source = {"run_config_sha256": provenance.config_sha256(cfg), "tag": tag,
              "train_steps": cfg.train.steps}
    return BenchmarkEvaluator(name, questions, make_grader(cfg.reward),
                              out_dir=rt.path("eval", tag, name),
                              batch_size=cfg.rollout.decode_slots, source=source,
                              restart_stale=True)


def run_policy(rt: Runtime, graphdef, model_state) -> Policy:
    """The run's policy as evaluations sample it: each question once at eval.temperature."""
    return Policy(graphdef, model_state, rt.chat, rt.toolbox,
                  rollout_config(rt.cfg, evaluation=True), rt.cfg.train.seed,
                  tool_calls_per_turn(rt.cfg), prefix_rows(rt.cfg))


def evaluate_run(rt: Runtime, graphdef, model_state, *, tag: str,
                 curve_questions: int = 0) -> dict[str, float]:
    """The `eval/...` metrics of the policy `model_state` on every dataset of eval.datasets
    (and `curve/...`, the validation curve's point, from the synthetic world's first
    `curve_questions` questions); the evaluation's files written."""
    # The world first, then the benchmarks in their order (the order the metrics always had).
    names = sorted(rt.cfg.eval.datasets, key=lambda n: n != loader_lib.SYNTHETIC)
    evaluators = (EVALUATORS[name](rt, name, tag, curve_questions) for name in names)
    return evaluate_with(rt, tag, evaluators, run_policy(rt, graphdef, model_state))


def evaluate_with(rt: Runtime, tag: str, evaluators: Iterable[Evaluator],
                  policy: Policy) -> dict[str, float]:
    """Runs each evaluator in turn (each built just before it runs) and writes the files of the
    evaluation `tag`; returns its metrics."""
    evaluations: list[Evaluation] = [evaluator.run(policy) for evaluator in evaluators]
    if jax.process_index() == 0:
        cfg = policy.rollout_cfg
        header = (f"# Evaluation {tag}\n\nmode: {cfg.mode}; temperature: {cfg.temperature:g}; "
                  f"grader: {rt.cfg.reward.method}")
        report.write_evaluation(rt.path("eval"), tag, evaluations, header)
    return report.merged_metrics(evaluations)
