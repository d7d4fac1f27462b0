"""A benchmark's evaluator: K sampled answers per question, graded, written as they come,
resumable.

    questions = benchmark_questions("frames", records)          # questions.py
    grader = Grader("judge", judge=LLMJudge(JudgeConfig(base_url=URL, model=...)))  # grading.py
    evaluation = BenchmarkEvaluator("frames", questions, grader, out_dir=D,
                                    batch_size=8).run(policy)                       # collect.Policy

`policy.rollout_cfg.group_size` is K: each question is rolled out K times in one batch (MATPO
planners with their workers, or single agents; whatever `rollout_cfg.mode` says). Per-question
results and transcripts go to `out_dir` (results.py); an interrupted evaluation resumes at the
first question without a result line, and results whose judge failed are graded again.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, Mapping, Sequence

from matpo_jax.report import files
from matpo_jax.run.eval import report, results as results_lib, summary as summary_lib
from matpo_jax.run.eval.collect import Policy, RolloutFn, rollout_and_grade, rollout_sampler
from matpo_jax.run.eval.grading import Grader
from matpo_jax.run.eval.protocol import Evaluation
from matpo_jax.run.eval.questions import BenchmarkQuestion

log = logging.getLogger(__name__)


class BenchmarkEvaluator:
    """`eval/<label>/...` metrics and the per-group summary of one dataset's questions."""

    def __init__(self, label: str, questions: Sequence[BenchmarkQuestion], grader: Grader, *,
                 out_dir: str, batch_size: int, source: Mapping[str, Any] | None = None,
                 restart_stale: bool = False):
        self.label, self.questions, self.grader = label, questions, grader
        self.out_dir, self.batch_size, self.source = out_dir, batch_size, source
        self.restart_stale = restart_stale

    def run(self, policy: Policy) -> Evaluation:
        results = evaluate_dataset(self.questions, rollout_sampler(policy, self.label),
                                   self.grader, samples=policy.samples, out_dir=self.out_dir,
                                   batch_size=self.batch_size, decode=policy.chat.decode,
                                   source=self.source, restart_stale=self.restart_stale)
        summary = summary_lib.summarize(results)
        log.info("%s: avg@%d %.3f over %d questions", self.label, policy.samples,
                 summary[summary_lib.ALL].avg_at_k, len(results))
        return Evaluation(report.benchmark_metrics(self.label, summary[summary_lib.ALL]),
                          summaries={self.label: summary})


def evaluate_dataset(questions: Sequence[BenchmarkQuestion], rollout_fn: RolloutFn,
                     grader: Grader, *, samples: int, out_dir: str, batch_size: int = 8,
                     decode: Callable[[Sequence[int]], str] | None = None,
                     regrade_failures: bool = True,
                     source: Mapping[str, Any] | None = None,
                     restart_stale: bool = False) -> list[dict]:
    """Every question's result (earlier runs' included), in `questions` order.

    Batches are fixed slices of `questions` (batch b: questions b*batch_size ...), so a rerun
    samples a batch with the same `rollout_fn(..., b)` key; only questions without a result line
    are rolled out. `source`: what produced the answers (job.evaluation_source: checkpoint path
    and step, hashes, temperature), recorded on every result line; a rerun with another source
    is refused (results.resume), never mixed in; with `restart_stale` (a run's own directory)
    the other source's results are set aside and the questions evaluated anew.
    """
    if samples < 1 or batch_size < 1:
        raise ValueError(f"samples={samples} and batch_size={batch_size} must be >= 1")
    files.makedirs(out_dir)
    wanted = {q.id for q in questions}
    source = dict(source or {})
    earlier = results_lib.resume(out_dir, grader, samples, source, regrade=regrade_failures,
                                 restart_stale=restart_stale)
    done = {r["id"]: r for r in earlier if r["id"] in wanted}
    if done:
        log.info("%s: %d of %d questions already evaluated", out_dir, len(done), len(questions))

    def grade_fn(positions, rollouts, outcomes):
        grades = grader.grade_many([(questions[p].question, questions[p].answers, o.prediction)
                                    for p, row in zip(positions, outcomes) for o in row])
        return [grades[i * samples:(i + 1) * samples] for i in range(len(positions))]

    for graded in rollout_and_grade([q.question for q in questions], rollout_fn, grade_fn,
                                    samples=samples, batch_size=batch_size, decode=decode,
                                    skip=lambda p: questions[p].id in done):
        new_results, transcripts = [], []
        for p, row, grades in zip(graded.positions, graded.outcomes, graded.grades):
            q = questions[p]
            result = {"id": q.id, "question": q.question, "answers": q.answers,
                      "categories": q.categories, "grader": grader.method, "source": source,
                      "samples": []}
            for s, (outcome, grade) in enumerate(zip(row, grades)):
                result["samples"].append({"prediction": outcome.prediction, "grade": grade,
                                          "tool_calls": outcome.tool_calls,
                                          "worker_calls": outcome.worker_calls,
                                          "finish_reason": outcome.finish_reason})
                transcripts.append({"id": q.id, "sample": s, "prediction": outcome.prediction,
                                    "grade": grade, "agents": outcome.transcript})
            new_results.append(result)
            done[q.id] = result
        # Transcripts first: a result line is the mark that its question is finished.
        results_lib.append_jsonl(os.path.join(out_dir, results_lib.TRANSCRIPTS_FILE), transcripts)
        results_lib.append_jsonl(os.path.join(out_dir, results_lib.RESULTS_FILE), new_results)
    return [done[q.id] for q in questions]
