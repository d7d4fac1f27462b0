"""The metrics every evaluator logs and the files one evaluation writes, in one place.

Metrics: the synthetic world's `eval/accuracy`, `eval/accuracy_hop<h>`, `eval/reward`,
`eval/answered`, `eval/tool_calls_per_question`, `eval/worker_calls_per_question`,
`eval/questions` (and the same as `curve/...` for the validation curve's questions); a
benchmark's `eval/<dataset>/accuracy`, `.../not_attempted`, `.../tool_calls_per_question`,
`.../worker_calls_per_question`, `.../judge_failures`, `.../questions`.

Files of the evaluation `tag`, in <workdir>/eval/: <tag>.json (every metric), <tag>_samples.txt
(a few decoded transcripts of the synthetic world), <tag>_questions.jsonl (the synthetic world's
outcome per question, as results.py's lines: `python -m matpo_jax.run.eval.paired` compares two),
<tag>/report.md and report.json (the benchmarks' table, summary.py) beside <tag>/<dataset>/
(results.py).
"""
from __future__ import annotations

import collections
import json
import math
import os
from typing import Mapping, Sequence

import numpy as np

from matpo_jax.report.files import write_json_atomic, write_text_atomic
from matpo_jax.run.eval import summary as summary_lib
from matpo_jax.run.eval.protocol import Evaluation


def question_metrics(rows: Sequence, prefix: str) -> dict[str, float]:
    """Accuracy (overall and per hop count), reward, answered fraction and tool use per question
    of `rows` (world.QuestionRow), each key `<prefix>name`."""
    n = len(rows)
    by_hops = collections.defaultdict(list)
    for row in rows:
        by_hops[row.hops].append(row.accuracy)
    out = {
        "accuracy": float(np.mean([r.accuracy for r in rows])),
        "reward": float(np.mean([r.reward for r in rows])),
        "tool_calls_per_question": sum(r.tool_calls for r in rows) / n,
        "worker_calls_per_question": sum(r.worker_calls for r in rows) / n,
        "answered": float(np.mean([r.answered for r in rows])),
        "questions": float(n),
    }
    out.update({f"accuracy_hop{h}": float(np.mean(v)) for h, v in sorted(by_hops.items())})
    return {f"{prefix}{name}": value for name, value in out.items()}


def benchmark_metrics(name: str, summary: summary_lib.GroupSummary) -> dict[str, float]:
    """`eval/<name>/...` of a benchmark's "all" group; nan (nothing graded: every judge call
    failed) is left out rather than logged as a number."""
    values = {"accuracy": summary.avg_at_k, "not_attempted": summary.not_attempted,
              "tool_calls_per_question": summary.tool_calls,
              "worker_calls_per_question": summary.worker_calls,
              "judge_failures": float(summary.judge_failures),
              "questions": float(summary.questions)}
    return {f"eval/{name}/{key}": float(value) for key, value in values.items()
            if not math.isnan(value)}


def write_evaluation(eval_dir: str, tag: str, evaluations: Sequence[Evaluation],
                     table_header: str) -> dict[str, float]:
    """Writes the files of the evaluation `tag` (process 0 calls it); returns its metrics."""
    metrics = merged_metrics(evaluations)
    write_json_atomic(os.path.join(eval_dir, f"{tag}.json"), metrics, indent=1, sort_keys=True)
    for evaluation in evaluations:
        if evaluation.samples_text is not None:
            write_text_atomic(os.path.join(eval_dir, f"{tag}_samples.txt"),
                              evaluation.samples_text)
        if evaluation.question_results is not None:
            write_text_atomic(os.path.join(eval_dir, f"{tag}_questions.jsonl"), "".join(
                json.dumps(line) + "\n" for line in evaluation.question_results))
    summaries: dict[str, Mapping] = {}
    for evaluation in evaluations:
        summaries.update(evaluation.summaries or {})
    if summaries:
        summary_lib.write_report(os.path.join(eval_dir, tag), summaries, table_header)
    return metrics


def merged_metrics(evaluations: Sequence[Evaluation]) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for evaluation in evaluations:
        metrics.update(evaluation.metrics)
    return metrics
