"""Benchmark numbers from per-question results (results.py), per dataset and category.

For a question with K samples, of which g were graded (the judge answered) with c correct and n
not attempted, and f judge failures (g + f = K):
    avg@K          mean over questions with g > 0 of c / g
    pass@K         mean of [c > 0] over the questions whose outcome is known: c > 0, or f = 0
    not attempted  mean over questions with g > 0 of n / g
    tool calls, worker calls   per question and sample: mean over questions of (calls / K)
    judge failures             failed samples, summed; `ungraded` counts questions with g = 0
A judge failure is left out of every rate (never counted as wrong) and reported on its own.
Groups: "all", then one per category value (a FRAMES question with two reasoning types counts in
both groups).
"""
from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
from typing import Mapping, Sequence

from matpo_jax.report import files
from matpo_jax.run.eval.grading import CORRECT, NOT_ATTEMPTED

ALL = "all"
REPORT_MD, REPORT_JSON = "report.md", "report.json"


@dataclasses.dataclass(frozen=True)
class GroupSummary:
    questions: int
    samples: int  # K (the largest sample count in the group)
    avg_at_k: float  # nan when no sample of the group was graded
    pass_at_k: float
    not_attempted: float
    tool_calls: float
    worker_calls: float
    judge_failures: int
    ungraded: int  # questions without any graded sample


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def summarize_group(results: Sequence[dict]) -> GroupSummary:
    avg, passed, not_attempted, tools, workers = [], [], [], [], []
    failures = ungraded = samples = 0
    for result in results:
        grades = [s["grade"] for s in result["samples"]]
        k = len(grades)
        samples = max(samples, k)
        graded = [g for g in grades if g is not None]
        correct = sum(g == CORRECT for g in graded)
        failed = k - len(graded)
        failures += failed
        tools.append(sum(s["tool_calls"] for s in result["samples"]) / k)
        workers.append(sum(s["worker_calls"] for s in result["samples"]) / k)
        if not graded:
            ungraded += 1
        else:
            avg.append(correct / len(graded))
            not_attempted.append(sum(g == NOT_ATTEMPTED for g in graded) / len(graded))
        if correct or not failed:
            passed.append(float(correct > 0))
    return GroupSummary(questions=len(results), samples=samples, avg_at_k=_mean(avg),
                        pass_at_k=_mean(passed), not_attempted=_mean(not_attempted),
                        tool_calls=_mean(tools), worker_calls=_mean(workers),
                        judge_failures=failures, ungraded=ungraded)


def summarize(results: Sequence[dict]) -> dict[str, GroupSummary]:
    """"all" and "<category> <value>" groups (categories and values sorted) -> summary."""
    groups: dict[str, list[dict]] = collections.defaultdict(list)
    for result in results:
        for category, values in result.get("categories", {}).items():
            for value in dict.fromkeys(values):  # a value listed twice counts once
                groups[f"{category} {value}"].append(result)
    out = {ALL: summarize_group(results)}
    out.update({name: summarize_group(groups[name]) for name in sorted(groups)})
    return out


def _percent(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:.1f}"


def _number(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def markdown_table(summaries: Mapping[str, Mapping[str, GroupSummary]]) -> str:
    """One row per dataset and group; accuracies in percent."""
    k = max((s.samples for groups in summaries.values() for s in groups.values()), default=1)
    lines = [f"| dataset | group | questions | avg@{k} | pass@{k} | not attempted | "
             f"tool calls / q | worker calls / q | judge failures |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for dataset, groups in summaries.items():
        for name, s in groups.items():
            failures = str(s.judge_failures) + (f" ({s.ungraded} ungraded)" if s.ungraded else "")
            lines.append(f"| {dataset} | {name} | {s.questions} | {_percent(s.avg_at_k)} | "
                         f"{_percent(s.pass_at_k)} | {_percent(s.not_attempted)} | "
                         f"{_number(s.tool_calls)} | {_number(s.worker_calls)} | {failures} |")
    return "\n".join(lines) + "\n"


def write_report(out_dir: str, summaries: Mapping[str, Mapping[str, GroupSummary]],
                 header: str = "", footer: str = "") -> str:
    """report.md (header, the table, footer) and report.json (the numbers) in `out_dir`; returns
    the table."""
    table = markdown_table(summaries)
    files.write_text_atomic(os.path.join(out_dir, REPORT_MD),
                            (header + "\n\n" if header else "") + table
                            + ("\n" + footer if footer else ""))
    numbers = {dataset: {name: dataclasses.asdict(s) for name, s in groups.items()}
               for dataset, groups in summaries.items()}
    # nan is written as NaN (json's default)
    files.write_text_atomic(os.path.join(out_dir, REPORT_JSON), json.dumps(numbers, indent=1))
    return table
