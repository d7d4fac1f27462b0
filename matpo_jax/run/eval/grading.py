"""Grades of one answer: correct / incorrect / not_attempted, or None where the LLM judge failed.

Offline graders (exact match, token F1 over the accepted answers) never fail. A sample without a
boxed answer, or an answer empty once normalised (`\\boxed{}`, `\\boxed{the}`), is not_attempted
without asking the judge. A judge failure (after its retries) is
never counted as wrong: it is reported on its own (report.py).
"""
from __future__ import annotations

from typing import Sequence

from matpo_jax.config import ConfigError, RewardSection
from matpo_jax.rl import judge as judge_lib
from matpo_jax.rl import rewards as rewards_lib
from matpo_jax.rl.answer_normalization import is_empty_answer
from matpo_jax.run.runtime import judge_config

CORRECT, INCORRECT, NOT_ATTEMPTED = "correct", "incorrect", "not_attempted"
GRADES = (CORRECT, INCORRECT, NOT_ATTEMPTED)
_JUDGE_GRADES = {judge_lib.CORRECT: CORRECT, judge_lib.INCORRECT: INCORRECT,
                 judge_lib.NOT_ATTEMPTED: NOT_ATTEMPTED}
GRADER_METHODS = ("exact", "f1", "judge")


class Grader:
    """Grades predictions against the accepted answers: exact match, token F1 >= threshold, or an
    LLM judge (CORRECT / INCORRECT / NOT_ATTEMPTED; None where it failed after its retries)."""

    def __init__(self, method: str = "exact", *, judge: judge_lib.LLMJudge | None = None,
                 f1_threshold: float = 0.8):
        if method not in GRADER_METHODS:
            raise ValueError(f"grader {method!r}, expected one of {GRADER_METHODS}")
        if method == "judge" and judge is None:
            raise ValueError("grader 'judge' needs an LLMJudge (an OpenAI-compatible endpoint)")
        self.method, self.judge, self.f1_threshold = method, judge, f1_threshold

    def grade_many(self, items: Sequence[tuple[str, Sequence[str], str | None]]
                   ) -> list[str | None]:
        """(question, answers, prediction or None) -> grade, or None for a judge failure."""
        # No answer, or one empty once normalised (\boxed{}, \boxed{the}): nothing to grade.
        grades: list[str | None] = [NOT_ATTEMPTED if is_empty_answer(p) else None
                                    for _, _, p in items]
        answered = [i for i, (_, _, p) in enumerate(items) if not is_empty_answer(p)]
        if self.method == "judge":
            replies = self.judge.grade_many([(items[i][0], " | ".join(items[i][1]), items[i][2])
                                             for i in answered])
            for i, reply in zip(answered, replies):
                grades[i] = None if reply is None else _JUDGE_GRADES[reply]
        else:
            for i in answered:
                _, answers, prediction = items[i]
                hit = rewards_lib.accuracy(prediction, list(answers), self.method,
                                           f1_threshold=self.f1_threshold)
                grades[i] = CORRECT if hit else INCORRECT
        return grades


def make_grader(reward: RewardSection, method: str | None = None,
                judge_url: str | None = None) -> Grader:
    """The grader `method` (None: reward.method); the judge at `judge_url` (None:
    reward.judge_url)."""
    method = method or reward.method
    if method != "judge":
        return Grader(method, f1_threshold=reward.f1_threshold)
    url = judge_url or reward.judge_url
    if not url:
        raise ConfigError("grader 'judge' needs an endpoint: --judge_url or reward.judge_url")
    return Grader("judge", judge=judge_lib.LLMJudge(judge_config(reward, url)))
