"""The synthetic world's evaluator: greedy rollouts on `eval.split`, scored with the training
reward; accuracy per hop count and tool use per question.

Several processes: each rolls out a contiguous share of the questions on its own devices; the
per-question rows are gathered, so every process returns the metrics of all questions. The
trajectory statistics (eval/<rollout_stats>) combine the processes' own
(multihost.combine_metrics: exact for counts, equal-weight means otherwise). The transcripts shown
are process 0's share's first ones.
"""
from __future__ import annotations

from typing import Mapping, NamedTuple, Sequence

import jax
import numpy as np

from matpo_jax.agents.rollout import run_rollouts
from matpo_jax.agents.rollout_metrics import rollout_stats
from matpo_jax.agents.trajectory import WORKER
from matpo_jax.config import EvalSection
from matpo_jax.data import loader as loader_lib
from matpo_jax.parallel import multihost
from matpo_jax.rl import rewards as rewards_lib
from matpo_jax.run.eval import report
from matpo_jax.run.eval.collect import Policy, rollout_and_grade
from matpo_jax.run.eval.protocol import Evaluation
from matpo_jax.run.runtime import Runtime, reward_config, rng_for

SAMPLES_SHOWN = 3


def eval_selection(eval_cfg: EvalSection, split_sizes: Mapping[str, int]) -> tuple[str, int]:
    """(split, count): the first `eval.num_questions` questions (0: all) of `eval.split`."""
    available = split_sizes[eval_cfg.split]
    count = available if eval_cfg.num_questions == 0 else min(available, eval_cfg.num_questions)
    return eval_cfg.split, count


def eval_records(rt: Runtime, limit: int | None = None) -> list[dict]:
    """The evaluation questions (see `eval_selection`), or the first `limit` of them."""
    source = rt.assets.source(rt.cfg.eval.split)
    split, count = eval_selection(rt.cfg.eval, {rt.cfg.eval.split: len(source)})
    count = count if limit is None else min(count, limit)
    return [loader_lib.decode_record(source[i]) for i in range(count)]


class WorldEvaluator:
    """`<prefix>...` metrics of every record (default: the evaluation questions);
    curve_questions > 0 adds the first that many questions' as `curve/...` (the validation
    curve's point, curve.py)."""

    def __init__(self, rt: Runtime, records: Sequence[dict] | None = None, *,
                 prefix: str = "eval/", curve_questions: int = 0):
        self.rt, self.prefix, self.curve_questions = rt, prefix, curve_questions
        self.records = list(records) if records is not None else eval_records(rt)

    def run(self, policy: Policy) -> Evaluation:
        rt = self.rt
        start, stop = _process_share(len(self.records))
        records = self.records[start:stop]
        questions = [r["question"] for r in records]

        def rollout_fn(texts, batch_index):  # one batch: the whole share, one key
            local_state = multihost.to_local(policy.model_state, multihost.local_mesh(rt.mesh))
            return run_rollouts(local_state, policy.graphdef, policy.chat, policy.toolbox,
                                texts, policy.rollout_cfg, rng_for(policy.seed, 2),
                                question_offset=start,
                                max_tool_calls_per_turn=policy.max_tool_calls_per_turn,
                                prefix_rows=policy.prefix_rows).rollouts

        def grade_fn(positions, rollouts, outcomes):  # the training reward's breakdowns
            breakdowns = rewards_lib.rollout_rewards(
                rollouts, [records[p]["answer"] for p in positions], reward_config(rt.cfg),
                questions=[questions[p] for p in positions], judge=rt.judge)
            return [[breakdowns[o.owner.rollout_id] for o in row] for row in outcomes]

        graded = list(rollout_and_grade(questions, rollout_fn, grade_fn, samples=1,
                                        batch_size=max(1, len(questions))))
        rows = [QuestionRow(start + p, int(records[p]["hops"]), b.accuracy, b.reward,
                            b.prediction is not None, o.tool_calls + o.subagent_calls,
                            o.worker_calls)
                for g in graded for p, (o,), (b,) in zip(g.positions, g.outcomes, g.grades)]
        stats = rollout_stats([r for g in graded for r in g.rollouts])
        gathered = multihost.allgather_objects({"rows": rows, "stats": stats})
        # In question order, so the curve's questions are the first rows whatever finished
        # first. (Rows from other processes come back as plain sequences: rebuilt.)
        rows = sorted((QuestionRow(*row) for part in gathered for row in part["rows"]),
                      key=lambda r: r.index)
        metrics = report.question_metrics(rows, self.prefix)
        metrics.update({f"{self.prefix}{k}": v for k, v in
                        multihost.combine_metrics([part["stats"] for part in gathered]).items()})
        if self.curve_questions:
            metrics.update(report.question_metrics(rows[:self.curve_questions], "curve/"))
        return Evaluation(metrics, samples_text=self._samples(graded, records, policy.chat),
                          question_results=[self._result_line(row) for row in rows])

    def _result_line(self, row: QuestionRow) -> dict:
        """results.py's line of one question (one greedy sample, graded by the training reward's
        accuracy)."""
        record = self.records[row.index]
        return {"id": record.get("id", f"{self.rt.cfg.eval.split}-{row.index:05d}"),
                "question": record["question"], "answers": [record["answer"]],
                "categories": {"hops": [str(row.hops)]}, "grader": self.rt.cfg.reward.method,
                "samples": [{"grade": "correct" if row.accuracy >= 1.0 else "incorrect",
                             "answered": bool(row.answered), "tool_calls": row.tool_calls,
                             "worker_calls": row.worker_calls}]}

    @staticmethod
    def _samples(graded, records, chat) -> str:
        """The first transcripts, in the order the rollouts finished."""
        shown = [(g, owner) for g in graded for owner in g.rollouts if owner.role != WORKER]
        lines = []
        for g, owner in shown[:SAMPLES_SHOWN]:
            q = owner.query_index  # its row in the batch
            outcome, b = g.outcomes[q][0], g.grades[q][0]
            record = records[g.positions[q]]
            lines.append(f"=== Q: {record['question']}  gold: {record['answer']}  "
                         f"predicted: {b.prediction}  acc: {b.accuracy}")
            lines.append(chat.decode(owner.tokens))
            for worker in outcome.agents[1:]:
                lines.append(f"--- worker {worker.rollout_id} ---")
                lines.append(chat.decode(worker.tokens))
        return "\n".join(lines) + "\n"


class QuestionRow(NamedTuple):
    """One evaluated question's outcome."""
    index: int  # in the evaluated records
    hops: int
    accuracy: float
    reward: float
    answered: bool
    tool_calls: int
    worker_calls: int


def _process_share(count: int) -> tuple[int, int]:
    """[start, stop) of this process's evaluation questions: contiguous, sizes differing by at
    most one (the count need not divide by the processes)."""
    bounds = np.linspace(0, count, jax.process_count() + 1).round().astype(int)
    index = jax.process_index()
    return int(bounds[index]), int(bounds[index + 1])
