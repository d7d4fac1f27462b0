"""The one rollout-and-grade path of every evaluator: fixed batches of questions rolled out by
the policy, each (question, sample) reduced to its outcome, then graded.

    for graded in rollout_and_grade(questions, rollout_fn, grade_fn, samples=K, batch_size=B):
        graded.positions, graded.outcomes[q][s], graded.grades[q][s], graded.rollouts

Batch b is questions[b*B : (b+1)*B] less those `skip` names, rolled out by rollout_fn(texts, b),
so a resumed evaluation samples a batch with the same key. What a grade is belongs to the
evaluator: the benchmarks' grade string (grading.py), the synthetic world's reward breakdown.
"""
from __future__ import annotations

import dataclasses
import zlib
from typing import Any, Callable, Iterator, Sequence

import jax

from matpo_jax.agents.rollout import run_rollouts
from matpo_jax.agents.trajectory import WORKER, Rollout
from matpo_jax.config import RolloutSection
from matpo_jax.config.sections import DEFAULT_TOOL_CALLS_PER_TURN
from matpo_jax.rl import rewards as rewards_lib
from matpo_jax.tools.schemas import SUBAGENT_SCHEMA

_SUBAGENT = SUBAGENT_SCHEMA["function"]["name"]

RolloutFn = Callable[[list[str], int], Sequence[Rollout]]  # (questions, batch index) -> rollouts


@dataclasses.dataclass(frozen=True)
class Policy:
    """What answers the questions: the model, its tokenizer and tools, how it samples."""
    graphdef: Any
    model_state: Any
    chat: Any  # chat.ChatFormat
    toolbox: Any  # tools.ToolBox
    rollout_cfg: RolloutSection  # group_size: the samples per question
    seed: int
    max_tool_calls_per_turn: int = DEFAULT_TOOL_CALLS_PER_TURN  # tools.max_calls_per_turn
    prefix_rows: int = 0  # run_rollouts' (a training run's: its RL batch's, runtime.prefix_rows)

    @property
    def samples(self) -> int:
        return self.rollout_cfg.group_size


@dataclasses.dataclass
class SampleOutcome:
    prediction: str | None  # the last \boxed{} answer of the planner / single agent
    tool_calls: int  # search / open calls of the agent and its workers
    subagent_calls: int  # the planner's calls of the subagent tool
    worker_calls: int  # workers the planner called
    finish_reason: str
    transcript: list[dict]  # [{role, rollout_id, finish_reason, text}], the owner first
    agents: list[Rollout]  # the owner (planner or single agent), then its workers

    @property
    def owner(self) -> Rollout:
        return self.agents[0]


def sample_outcomes(rollouts: Sequence[Rollout], num_questions: int, samples: int,
                    decode: Callable[[Sequence[int]], str] | None = None
                    ) -> list[list[SampleOutcome]]:
    """[question][sample] outcomes of one batch of rollouts (G = samples per question)."""
    by_id = {r.rollout_id: r for r in rollouts}
    table: list[list[SampleOutcome | None]] = [[None] * samples for _ in range(num_questions)]

    def text(r: Rollout) -> str:
        return decode(r.tokens) if decode is not None else "\n".join(r.assistant_texts)

    for owner in rollouts:
        if owner.role == WORKER:
            continue
        workers = [by_id[c] for c in owner.child_ids]
        agents = [owner, *workers]
        calls = [c.name for a in agents for c in a.tool_calls]
        table[owner.query_index][owner.sample_index] = SampleOutcome(
            prediction=rewards_lib.final_answer(owner),
            tool_calls=sum(name != _SUBAGENT for name in calls),
            subagent_calls=sum(name == _SUBAGENT for name in calls),
            worker_calls=len(workers),
            finish_reason=owner.finish_reason,
            transcript=[{"role": a.role, "rollout_id": a.rollout_id,
                         "finish_reason": a.finish_reason, "text": text(a)} for a in agents],
            agents=agents)
    missing = [(q, s) for q in range(num_questions) for s in range(samples) if table[q][s] is None]
    if missing:
        raise RuntimeError(f"rollouts lack (question, sample) {missing[:3]}: the rollout config's "
                           f"group_size must equal the number of samples ({samples})")
    return table


def rollout_sampler(policy: Policy, dataset: str) -> RolloutFn:
    """Rollouts of the policy; batch b of a dataset always samples with the same key."""
    salt = zlib.crc32(dataset.encode())

    def sample(questions: list[str], batch_index: int) -> Sequence[Rollout]:
        rng = jax.random.fold_in(jax.random.fold_in(jax.random.key(policy.seed), salt),
                                 batch_index)
        return run_rollouts(policy.model_state, policy.graphdef, policy.chat, policy.toolbox,
                            questions, policy.rollout_cfg, rng,
                            max_tool_calls_per_turn=policy.max_tool_calls_per_turn,
                            prefix_rows=policy.prefix_rows).rollouts

    return sample


@dataclasses.dataclass
class GradedBatch:
    index: int  # the batch's number (its sampling key)
    positions: list[int]  # of its questions in the evaluated sequence
    outcomes: list[list[SampleOutcome]]  # [question][sample]
    grades: list[list[Any]]  # [question][sample], what the evaluator's grade_fn returns
    rollouts: Sequence[Rollout]


# (positions, the batch's rollouts, its outcomes) -> grades[question][sample]
GradeFn = Callable[[list[int], Sequence[Rollout], list[list[SampleOutcome]]], list[list[Any]]]


def rollout_and_grade(questions: Sequence[str], rollout_fn: RolloutFn, grade_fn: GradeFn, *,
                      samples: int, batch_size: int,
                      decode: Callable[[Sequence[int]], str] | None = None,
                      skip: Callable[[int], bool] = lambda position: False
                      ) -> Iterator[GradedBatch]:
    """The graded batches of `questions`, in order; batches whose questions are all skipped are
    not rolled out."""
    if samples < 1 or batch_size < 1:
        raise ValueError(f"samples={samples} and batch_size={batch_size} must be >= 1")
    for batch_index, start in enumerate(range(0, len(questions), batch_size)):
        positions = [i for i in range(start, min(start + batch_size, len(questions)))
                     if not skip(i)]
        if not positions:
            continue
        rollouts = rollout_fn([questions[i] for i in positions], batch_index)
        outcomes = sample_outcomes(rollouts, len(positions), samples, decode)
        yield GradedBatch(batch_index, positions, outcomes,
                          grade_fn(positions, rollouts, outcomes), rollouts)
