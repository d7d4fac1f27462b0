"""What every evaluator is (the registry, registry.py, picks them by the dataset's name).

    evaluation = evaluator.run(policy)     # policy: collect.Policy
    evaluation.metrics                     # logged as named ("eval/...", "curve/...")

An evaluator is built for one evaluation (one tag: "sft", "step10", "final") and run once.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Protocol, Sequence

from matpo_jax.run.eval.collect import Policy


@dataclasses.dataclass
class Evaluation:
    metrics: dict[str, float]
    samples_text: str | None = None  # a few decoded transcripts (<tag>_samples.txt)
    summaries: Mapping[str, Mapping] | None = None  # dataset -> group -> GroupSummary (report.md)
    # One line per question in results.jsonl's format (results.py), in question order
    # (<tag>_questions.jsonl): what paired.py compares question by question.
    question_results: Sequence[Mapping] | None = None


class Evaluator(Protocol):
    def run(self, policy: Policy) -> Evaluation: ...
