"""Outcome rewards for planner (or single-agent) rollouts, docs/METHOD.md section 3.

Accuracy is judged on the last `\\boxed{...}` the planner itself wrote (its own assistant turns),
never on tool responses or worker reports, which also enter its context. The format reward is
the fraction of valid tool calls per role. Combination:
  single agent      r   = 0.9*acc + 0.1*fmt
  MATPO planner i   r_i = 0.9*acc_i + 0.5*(0.1*fmt_planner_i + mean_k 0.1*fmt_worker_ik)
(the worker term is 0 when planner i called no worker).
`reward.format_credit` chooses when the format term counts: always (MATPO's rule), only when the
answer is right (when_correct: a group whose samples are all wrong then has equal rewards and no
advantage, instead of one that favours fewer tool calls), or never (off).
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Mapping, Sequence

import numpy as np

from matpo_jax.agents.trajectory import PLANNER, SINGLE, WORKER, Rollout
from matpo_jax.rl.answer_normalization import is_empty_answer, normalize_answer  # noqa: F401
from matpo_jax.rl.judge import CORRECT, LLMJudge
from matpo_jax.chat import answer_text, extract_boxed
from matpo_jax.config.sections import FORMAT_CREDITS, RewardSection, RolloutSection

ACCURACY_METHODS = ("exact", "f1", "judge")
REWARD_MODES = ("matpo", "single")
ACC_WEIGHT, FMT_WEIGHT, MATPO_FMT_SHARE = 0.9, 0.1, 0.5

Gold = str | Sequence[str]  # one answer, or a list of accepted aliases


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """The reward stage's settings: `rollout.mode` and the config's reward section, put together
    in one place (run.runtime.reward_config). No defaults: the config's are the defaults."""

    mode: str  # matpo | single (rollout.mode)
    f1_threshold: float  # reward.f1_threshold
    method: str  # exact | f1 | judge (reward.method)
    format_credit: str  # always | when_correct | off (reward.format_credit)

    def __post_init__(self):
        if self.format_credit not in FORMAT_CREDITS:
            raise ValueError(f"RewardConfig.format_credit={self.format_credit!r}, expected one of "
                             f"{FORMAT_CREDITS}")
        if self.mode not in REWARD_MODES:
            raise ValueError(f"RewardConfig.mode={self.mode!r}, expected one of {REWARD_MODES}")
        if self.method not in ACCURACY_METHODS:
            raise ValueError(f"RewardConfig.method (the accuracy method) = {self.method!r}, "
                             f"expected one of {ACCURACY_METHODS}")


def default_reward_config() -> RewardConfig:
    """The reward settings of the default experiment, read from the config's declarations."""
    return RewardConfig(mode=RolloutSection().mode, method=RewardSection().method,
                        f1_threshold=RewardSection().f1_threshold,
                        format_credit=RewardSection().format_credit)


# ----------------------------------------------------------------------------- answer extraction
# extract_boxed is the chat format's parser, so rollouts and rewards agree on answers.

def final_answer(rollout: Rollout) -> str | None:
    """The last boxed answer over the rollout's own sampled turns (latest turn wins), read
    outside the reasoning (`chat.answer_text`): a box only in think text is no answer."""
    for text in reversed(rollout.assistant_texts):
        answer = extract_boxed(answer_text(text))
        if answer is not None:
            return answer
    return None


# ----------------------------------------------------------------------------- string matching

# normalize_answer: the one normalisation (rl/answer_normalization.py), re-exported here.


def exact_match(prediction: str, gold: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(gold)


def token_f1(prediction: str, gold: str) -> float:
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(pred_tokens), overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _aliases(gold: Gold) -> list[str]:
    return [gold] if isinstance(gold, str) else list(gold)


def accuracy(prediction: str | None, gold: Gold, method: str = "exact", *,
             f1_threshold: float = 0.8, judge: LLMJudge | None = None,
             question: str = "") -> float:
    """1.0 if the prediction matches any gold alias by `method`, else 0.0 (no answer, or one
    empty once normalised, -> 0.0: `\\boxed{}` or `\\boxed{the}` never scores)."""
    if is_empty_answer(prediction):
        return 0.0
    if method == "exact":
        return float(any(exact_match(prediction, g) for g in _aliases(gold)))
    if method == "f1":
        return float(max(token_f1(prediction, g) for g in _aliases(gold)) >= f1_threshold)
    if method == "judge":
        if judge is None:
            raise ValueError("accuracy method 'judge' needs an LLMJudge")
        return float(judge.is_correct(question, " | ".join(_aliases(gold)), prediction))
    raise ValueError(f"accuracy method {method!r}, expected one of {ACCURACY_METHODS}")


# ----------------------------------------------------------------------------- combination

@dataclasses.dataclass(frozen=True)
class RewardBreakdown:
    """The reward of one planner/single rollout and the parts it is made of (for metrics)."""

    rollout_id: int
    reward: float
    accuracy: float
    format_own: float
    format_workers: float | None  # mean worker format score; None when no worker was called
    num_workers: int
    prediction: str | None
    judge_failed: bool = False


def combine_reward(acc: float, fmt_own: float, fmt_workers: Sequence[float], mode: str,
                   format_credit: str = "always") -> float:
    if format_credit == "off" or (format_credit == "when_correct" and acc <= 0):
        return ACC_WEIGHT * acc
    if mode == "single":
        return ACC_WEIGHT * acc + FMT_WEIGHT * fmt_own
    worker_term = FMT_WEIGHT * float(np.mean(fmt_workers)) if len(fmt_workers) else 0.0
    return ACC_WEIGHT * acc + MATPO_FMT_SHARE * (FMT_WEIGHT * fmt_own + worker_term)


def rollout_rewards(rollouts: Sequence[Rollout], golds: Sequence[Gold],
                    config: RewardConfig | None = None, *,
                    questions: Sequence[str] | None = None,
                    judge: LLMJudge | None = None) -> dict[int, RewardBreakdown]:
    """Rewards of every planner (or single-agent) rollout, keyed by rollout_id.

    golds[q] / questions[q] belong to query_index q. Workers get no reward of their own: their
    format scores enter their parent's reward, and their tokens get their parent's advantage.
    config None: the default experiment's (`default_reward_config`).
    """
    config = config or default_reward_config()
    workers_of: dict[int, list[Rollout]] = collections.defaultdict(list)
    for r in rollouts:
        if r.role == WORKER:
            workers_of[r.parent_id].append(r)
    owners = [r for r in rollouts if r.role in (PLANNER, SINGLE)]
    predictions = [final_answer(r) for r in owners]

    if config.method == "judge":
        if judge is None:
            raise ValueError("RewardConfig.method='judge' needs an LLMJudge")
        if questions is None:
            raise ValueError("RewardConfig.method='judge' needs the questions")
        # An empty answer is never right: not sent to the judge (which might call it so).
        to_grade = [i for i, p in enumerate(predictions) if not is_empty_answer(p)]
        grades = judge.grade_many([
            (questions[owners[i].query_index], " | ".join(_aliases(golds[owners[i].query_index])),
             predictions[i]) for i in to_grade])
        grade_of = dict(zip(to_grade, grades))
        accuracies = [float(grade_of.get(i) == CORRECT) for i in range(len(owners))]
        failed = [i in grade_of and grade_of[i] is None for i in range(len(owners))]
    else:
        accuracies = [accuracy(p, golds[r.query_index], config.method,
                               f1_threshold=config.f1_threshold)
                      for r, p in zip(owners, predictions)]
        failed = [False] * len(owners)

    result = {}
    for r, pred, acc, judge_failed in zip(owners, predictions, accuracies, failed):
        worker_scores = [w.format_score() for w in workers_of.get(r.rollout_id, [])]
        result[r.rollout_id] = RewardBreakdown(
            rollout_id=r.rollout_id,
            reward=combine_reward(acc, r.format_score(), worker_scores, config.mode,
                                  config.format_credit),
            accuracy=acc,
            format_own=r.format_score(),
            format_workers=float(np.mean(worker_scores)) if worker_scores else None,
            num_workers=len(worker_scores),
            prediction=pred,
            judge_failed=judge_failed,
        )
    return result


def reward_metrics(breakdowns: Mapping[int, RewardBreakdown]) -> dict[str, float]:
    """Batch means of the reward and its parts, for logging."""
    items = list(breakdowns.values())
    if not items:
        return {}
    worker_formats = [b.format_workers for b in items if b.format_workers is not None]
    return {
        "reward/mean": float(np.mean([b.reward for b in items])),
        "reward/accuracy": float(np.mean([b.accuracy for b in items])),
        "reward/format_planner": float(np.mean([b.format_own for b in items])),
        "reward/format_worker": float(np.mean(worker_formats)) if worker_formats else float("nan"),
        "reward/workers_per_rollout": float(np.mean([b.num_workers for b in items])),
        "reward/answered": float(np.mean([b.prediction is not None for b in items])),
        "reward/judge_failures": float(sum(b.judge_failed for b in items)),
    }


def rewards_by_id(breakdowns: Mapping[int, RewardBreakdown]) -> dict[int, float]:
    return {rid: b.reward for rid, b in breakdowns.items()}
