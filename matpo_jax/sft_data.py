"""Supervised warm-start data: oracle demonstrations as trainer sequences.

Demonstrations are rendered through the SAME ChatFormat as rollouts, so the trainable mask marks
exactly the tokens a policy would have sampled (assistant turns and their closing `<|im_end|>`),
and tool outputs come from the same tool clients the rollouts call.
"""
from __future__ import annotations

import numpy as np

from matpo_jax.agents.trajectory import ROLE_IDS, PLANNER, SINGLE, WORKER
from matpo_jax.data.oracle import Demonstration, Oracle
from matpo_jax.data.synthetic_world import Question
from matpo_jax.rl.packing import TrainSequence
from matpo_jax.tokenizer import ChatFormat


def demonstrations(oracle: Oracle, questions: list[Question], mode: str,
                   solved_only: bool = True) -> list[Demonstration]:
    """One demonstration per question: a planner (with its workers) or a single agent."""
    act = oracle.planner if mode == "matpo" else oracle.single
    demos = [act(q) for q in questions]
    return [d for d in demos if d.solved or not solved_only]


def _sequence(chat: ChatFormat, demo: Demonstration, rollout_id: int, group_id: int,
              max_len: int) -> TrainSequence | None:
    ids, trainable = chat.render(demo.messages)
    if len(ids) > max_len:  # too long for the context budget: a policy could not produce it either
        return None
    return TrainSequence(tokens=np.asarray(ids, np.int32), trainable=np.asarray(trainable, bool),
                         old_logprobs=np.zeros(len(ids), np.float32), advantage=1.0,
                         role_id=ROLE_IDS[demo.role], rollout_id=rollout_id, group_id=group_id)


def demonstration_sequences(chat: ChatFormat, demos: list[Demonstration],
                            max_len: int) -> list[TrainSequence]:
    """Every conversation of every demonstration (a planner's workers included) as a sequence.

    A planner whose own context or any worker's context exceeds `max_len` is dropped whole, so the
    data never teaches a delegation whose worker half is missing.
    """
    out: list[TrainSequence] = []
    next_id = 0
    for demo in demos:
        assert demo.role in (PLANNER, SINGLE, WORKER), demo.role
        group = [_sequence(chat, demo, next_id, next_id, max_len)]
        group += [_sequence(chat, w, next_id + 1 + k, next_id, max_len)
                  for k, w in enumerate(demo.workers)]
        if all(s is not None for s in group):
            out.extend(group)
        next_id += len(group)
    return out
