"""Evaluation: greedy rollouts on a held-out split, accuracy per hop count and tool-use statistics.

Results go to <workdir>/eval/<tag>.json (numbers) and <tag>_samples.txt (a few decoded
transcripts, to read what the agents actually did).

Several processes: each rolls out a contiguous share of the questions on its own devices; the
per-question results are gathered, so every process returns the metrics of all questions, and
process 0 writes the files. The trajectory statistics (eval/<rollout_stats>) combine the
processes' own (multihost.combine_metrics: exact for counts, equal-weight means otherwise).
"""
from __future__ import annotations

import collections
from typing import Mapping, NamedTuple, Sequence

import jax
import numpy as np

from matpo_jax.agents.rollout import run_rollouts
from matpo_jax.agents.rollout_metrics import rollout_stats
from matpo_jax.report.files import write_json_atomic, write_text_atomic
from matpo_jax.agents.trajectory import WORKER
from matpo_jax.config import EvalSection
from matpo_jax.data import loader as loader_lib
from matpo_jax.parallel import multihost
from matpo_jax.rl import rewards as rewards_lib
from matpo_jax.run.runtime import (Runtime, reward_config, rng_for, rollout_config,
                                   tool_calls_per_turn)

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


def evaluate(rt: Runtime, graphdef, model_state, *, tag: str, records=None, prefix: str = "eval/",
             curve_questions: int = 0) -> dict[str, float]:
    """Rolls out every evaluation question once and returns `<prefix>...` metrics (scored with
    the training reward). curve_questions > 0 adds the per-question metrics of the first that
    many questions as `curve/...`: the validation curve's point (run/eval_curve.py)."""
    all_records = records if records is not None else eval_records(rt)
    start, stop = _process_share(len(all_records))
    records = all_records[start:stop]
    questions = [r["question"] for r in records]
    local_state = multihost.to_local(model_state, multihost.local_mesh(rt.mesh))
    batch = run_rollouts(local_state, graphdef, rt.chat, rt.toolbox, questions,
                         rollout_config(rt.cfg, evaluation=True), rng_for(rt.cfg.train.seed, 2),
                         question_offset=start,
                         max_tool_calls_per_turn=tool_calls_per_turn(rt.cfg))
    del local_state
    breakdowns = rewards_lib.rollout_rewards(batch.rollouts, [r["answer"] for r in records],
                                             reward_config(rt.cfg), questions=questions,
                                             judge=rt.judge)
    # One row per question of this share (G = 1: one owner each), gathered from every process.
    tool_calls = collections.Counter()
    worker_calls = collections.Counter()
    for r in batch.rollouts:
        tool_calls[r.query_index] += len(r.tool_calls)
        if r.role == WORKER:
            worker_calls[r.query_index] += 1
    rows = [QuestionRow(start + o.query_index, int(records[o.query_index]["hops"]),
                        breakdowns[o.rollout_id].accuracy, breakdowns[o.rollout_id].reward,
                        breakdowns[o.rollout_id].prediction is not None,
                        tool_calls[o.query_index], worker_calls[o.query_index])
            for o in batch.rollouts if o.role != WORKER]
    stats = rollout_stats(batch.rollouts)
    gathered = multihost.allgather_objects({"rows": rows, "stats": stats})
    # In question order, so the curve's questions are the first rows whatever finished first.
    # (Rows from other processes come back as plain sequences: rebuilt as QuestionRows.)
    rows = sorted((QuestionRow(*row) for part in gathered for row in part["rows"]),
                  key=lambda r: r.index)
    out = question_metrics(rows, prefix)
    out.update({f"{prefix}{k}": v for k, v in
                multihost.combine_metrics([part["stats"] for part in gathered]).items()})
    if curve_questions:
        out.update(question_metrics(rows[:curve_questions], "curve/"))
    if multihost.is_primary():  # its own share's transcripts
        _write(rt, tag, out, batch.rollouts, records, breakdowns)
    return out


class QuestionRow(NamedTuple):
    """One evaluated question's outcome."""
    index: int  # in the evaluated records
    hops: int
    accuracy: float
    reward: float
    answered: bool
    tool_calls: int
    worker_calls: int


def question_metrics(rows: Sequence[QuestionRow], prefix: str) -> dict[str, float]:
    """Accuracy (overall and per hop count), reward, answered fraction and tool use per question
    of `rows`, each key `<prefix>name`."""
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


def _process_share(count: int) -> tuple[int, int]:
    """[start, stop) of this process's evaluation questions: contiguous, sizes differing by at
    most one (the count need not divide by the processes)."""
    bounds = np.linspace(0, count, jax.process_count() + 1).round().astype(int)
    index = jax.process_index()
    return int(bounds[index]), int(bounds[index + 1])


def _write(rt: Runtime, tag: str, metrics: dict, rollouts, records, breakdowns) -> None:
    write_json_atomic(rt.path("eval", f"{tag}.json"), metrics, indent=1, sort_keys=True)
    by_id = {r.rollout_id: r for r in rollouts}
    lines = []
    for owner in [r for r in rollouts if r.role != WORKER][:SAMPLES_SHOWN]:
        record = records[owner.query_index]
        b = breakdowns[owner.rollout_id]
        lines.append(f"=== Q: {record['question']}  gold: {record['answer']}  "
                     f"predicted: {b.prediction}  acc: {b.accuracy}")
        lines.append(rt.chat.decode(owner.tokens))
        for child in owner.child_ids:
            lines.append(f"--- worker {child} ---")
            lines.append(rt.chat.decode(by_id[child].tokens))
    write_text_atomic(rt.path("eval", f"{tag}_samples.txt"), "\n".join(lines) + "\n")
