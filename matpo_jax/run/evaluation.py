"""Evaluation: greedy rollouts on a held-out split, accuracy per hop count and tool-use statistics.

Results go to <workdir>/eval/<tag>.json (numbers) and <tag>_samples.txt (a few decoded
transcripts, to read what the agents actually did).
"""
from __future__ import annotations

import collections
from typing import Mapping

import numpy as np

from matpo_jax.agents.rollout import run_rollouts
from matpo_jax.agents.rollout_metrics import rollout_stats
from matpo_jax.report.files import write_json_atomic, write_text_atomic
from matpo_jax.agents.trajectory import WORKER
from matpo_jax.config import EvalSection
from matpo_jax.data import loader as loader_lib
from matpo_jax.rl import rewards as rewards_lib
from matpo_jax.run.runtime import Runtime, reward_config, rng_for, rollout_config

SAMPLES_SHOWN = 3


def eval_selection(eval_cfg: EvalSection, split_sizes: Mapping[str, int]) -> tuple[str, int]:
    """(split, count): the first `eval.num_questions` questions (0: all) of `eval.split`."""
    available = split_sizes[eval_cfg.split]
    count = available if eval_cfg.num_questions == 0 else min(available, eval_cfg.num_questions)
    return eval_cfg.split, count


def eval_records(rt: Runtime) -> list[dict]:
    """The evaluation questions (see `eval_selection`)."""
    source = rt.assets.source(rt.cfg.eval.split)
    split, count = eval_selection(rt.cfg.eval, {rt.cfg.eval.split: len(source)})
    return [loader_lib.decode_record(source[i]) for i in range(count)]


def evaluate(rt: Runtime, graphdef, model_state, *, tag: str, records=None) -> dict[str, float]:
    """Rolls out every evaluation question once and returns `eval/...` metrics (scored with the
    training reward)."""
    records = records if records is not None else eval_records(rt)
    questions = [r["question"] for r in records]
    batch = run_rollouts(model_state, graphdef, rt.chat, rt.toolbox, questions,
                         rollout_config(rt.cfg, evaluation=True), rng_for(rt.cfg.train.seed, 2))
    breakdowns = rewards_lib.rollout_rewards(batch.rollouts, [r["answer"] for r in records],
                                             reward_config(rt.cfg), questions=questions,
                                             judge=rt.judge)
    owners = [r for r in batch.rollouts if r.role != WORKER]
    by_hops = collections.defaultdict(list)
    for owner in owners:
        by_hops[int(records[owner.query_index]["hops"])].append(breakdowns[owner.rollout_id].accuracy)
    tool_calls = collections.Counter()
    worker_calls = collections.Counter()
    for r in batch.rollouts:
        tool_calls[r.query_index] += len(r.tool_calls)
        if r.role == WORKER:
            worker_calls[r.query_index] += 1
    n = len(records)
    out = {
        "eval/accuracy": float(np.mean([breakdowns[o.rollout_id].accuracy for o in owners])),
        "eval/reward": float(np.mean([breakdowns[o.rollout_id].reward for o in owners])),
        "eval/tool_calls_per_question": sum(tool_calls.values()) / n,
        "eval/worker_calls_per_question": sum(worker_calls.values()) / n,
        "eval/answered": float(np.mean([breakdowns[o.rollout_id].prediction is not None
                                        for o in owners])),
        "eval/questions": float(n),
    }
    out.update({f"eval/accuracy_hop{h}": float(np.mean(v)) for h, v in sorted(by_hops.items())})
    out.update({f"eval/{k}": v for k, v in rollout_stats(batch.rollouts).items()})
    _write(rt, tag, out, batch.rollouts, records, breakdowns)
    return out


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
