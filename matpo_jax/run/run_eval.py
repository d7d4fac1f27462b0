"""Evaluation inside a training run: every dataset of `eval.datasets`, with the run's policy,
tokenizer, tools and grading.

The synthetic world is evaluated by run/evaluation.py (its `eval.split`, the training reward).
A benchmark (musique, frames, webwalkerqa, gaia) goes through the benchmark evaluator of
`python -m matpo_jax.evaluate` (run/benchmark_job.py): the benchmark's own split, its first
`eval.num_questions` questions (0: all), one sample at `eval.temperature`, graded by
`reward.method`, resumable; per-question results in <workdir>/eval/<tag>/<dataset>/ and the table
in <workdir>/eval/<tag>/report.md. Metrics `eval/<dataset>/accuracy`, `.../not_attempted`,
`.../tool_calls_per_question`, `.../worker_calls_per_question`, `.../judge_failures`,
`.../questions`; every metric of one evaluation in <workdir>/eval/<tag>.json.
"""
from __future__ import annotations

import math

import jax

from matpo_jax.data import loader as loader_lib
from matpo_jax.report.files import write_json_atomic
from matpo_jax.run import benchmark_job, benchmark_report
from matpo_jax.run.evaluation import evaluate
from matpo_jax.run.runtime import Runtime, rollout_config, tool_calls_per_turn


def evaluate_run(rt: Runtime, graphdef, model_state, *, tag: str,
                 curve_questions: int = 0) -> dict[str, float]:
    """The `eval/...` metrics of the policy `model_state` on every dataset of eval.datasets
    (and `curve/...`, the validation curve's point, from the synthetic world's first
    `curve_questions` questions)."""
    datasets = tuple(rt.cfg.eval.datasets)
    if datasets == (loader_lib.SYNTHETIC,):  # the synthetic world alone, as it always was
        return evaluate(rt, graphdef, model_state, tag=tag, curve_questions=curve_questions)
    metrics = {}
    if loader_lib.SYNTHETIC in datasets:
        metrics.update(evaluate(rt, graphdef, model_state, tag=tag,
                                curve_questions=curve_questions))
    benchmarks = [name for name in datasets if name != loader_lib.SYNTHETIC]
    metrics.update(_benchmark_metrics(rt, graphdef, model_state, tag, benchmarks))
    if jax.process_index() == 0:
        write_json_atomic(rt.path("eval", f"{tag}.json"), metrics, indent=1, sort_keys=True)
    return metrics


def _benchmark_metrics(rt: Runtime, graphdef, model_state, tag: str, names) -> dict[str, float]:
    cfg = rt.cfg
    out_dir = rt.path("eval", tag)
    options = benchmark_job.BenchmarkOptions(datasets=names, workdir=out_dir,
                                             num_questions=cfg.eval.num_questions)
    grader = benchmark_job.make_grader(cfg, options)
    rollout_cfg = rollout_config(cfg, evaluation=True)
    summaries, metrics = {}, {}
    for name in names:
        questions = benchmark_job.load_questions(cfg, name, None, options, rt.assets.data_dir)
        summary = benchmark_job.evaluate_benchmark(
            name, questions, model_state=model_state, graphdef=graphdef, chat=rt.chat,
            toolbox=rt.toolbox, rollout_cfg=rollout_cfg, seed=cfg.train.seed, grader=grader,
            samples=1, out_dir=f"{out_dir}/{name}", batch_size=cfg.rollout.decode_slots,
            max_tool_calls_per_turn=tool_calls_per_turn(cfg))
        summaries[name] = summary
        metrics.update(_summary_metrics(name, summary[benchmark_report.ALL]))
    if jax.process_index() == 0:
        benchmark_report.write_report(out_dir, summaries, f"# Evaluation {tag}\n\nmode: "
                                      f"{rollout_cfg.mode}; temperature: "
                                      f"{rollout_cfg.temperature:g}; grader: {grader.method}")
    return metrics


def _summary_metrics(name: str, summary: benchmark_report.GroupSummary) -> dict[str, float]:
    # nan (nothing graded: every judge call failed) is left out rather than logged as a number
    values = {"accuracy": summary.avg_at_k, "not_attempted": summary.not_attempted,
              "tool_calls_per_question": summary.tool_calls,
              "worker_calls_per_question": summary.worker_calls,
              "judge_failures": float(summary.judge_failures),
              "questions": float(summary.questions)}
    return {f"eval/{name}/{key}": float(value) for key, value in values.items()
            if not math.isnan(value)}
