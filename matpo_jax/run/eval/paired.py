"""Two evaluations of the same questions compared question by question: the gain with its 95%
confidence interval and an exact McNemar test, in all and per category (e.g. hop count).

  python -m matpo_jax.run.eval.paired --before=runs/demo/eval/sft_questions.jsonl \\
      --after=runs/demo/eval/final_questions.jsonl [--by=hops] [--out=paired.json]
  python -m matpo_jax.run.eval.paired --before=runs/bench_sft/synthetic_multihop \\
      --after=runs/bench/synthetic_multihop

Each side is a file of result lines, one per question: a run's evaluation writes
eval/<tag>_questions.jsonl, `python -m matpo_jax.evaluate` a dataset directory's results.jsonl
(a directory stands for the results.jsonl in it). A question's score is the fraction of its
samples graded correct (0 or 1 for the greedy evaluations). Pairing removes the questions' own
difficulty from the noise: the interval is the mean per-question difference +- 1.96 standard
errors of that mean, and with one sample per question McNemar's exact test asks whether the
questions that went wrong -> right outnumber the right -> wrong ones by more than chance (a
two-sided binomial test on the discordant questions). Both sides must hold the same question ids.
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from absl import flags

from matpo_jax.run.eval.results import RESULTS_FILE, read_results

Z_95 = 1.959963984540054  # two-sided 95% quantile of the standard normal


class PairedError(ValueError):
    """Evaluations that cannot be paired; the message names the file and the questions."""


@dataclasses.dataclass(frozen=True)
class PairedGain:
    questions: int
    before: float  # accuracy, fraction
    after: float
    gain: float  # after - before
    ci_low: float  # 95% interval of the gain
    ci_high: float
    right_to_wrong: int | None  # discordant questions (None when some question has several samples)
    wrong_to_right: int | None
    mcnemar_p: float | None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def question_scores(results: Sequence[dict], source: str = "results") -> dict[str, float]:
    """{question id: fraction of its samples graded correct}."""
    scores = {}
    for line, record in enumerate(results, 1):
        samples = record.get("samples") or []
        if "id" not in record or not samples:
            raise PairedError(f"{source}, line {line}: a result needs an id and at least one "
                              f"sample")
        scores[record["id"]] = float(np.mean([s.get("grade") == "correct" for s in samples]))
    return scores


def mcnemar_exact_p(right_to_wrong: int, wrong_to_right: int) -> float:
    """Two-sided exact McNemar p-value: 2 P(X <= min(b, c)) for X ~ Binomial(b + c, 1/2), at most
    1."""
    n = right_to_wrong + wrong_to_right
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(right_to_wrong, wrong_to_right) + 1)) / 2 ** n
    return min(1.0, 2.0 * tail)


def paired_gain(before: Mapping[str, float], after: Mapping[str, float]) -> PairedGain:
    """The gain after - before over questions both hold (the same ids on both sides)."""
    missing = sorted(set(before) ^ set(after))
    if missing:
        raise PairedError(f"{len(missing)} question(s) are on one side only, e.g. {missing[:5]}")
    ids = sorted(before)
    if not ids:
        raise PairedError("no questions to compare")
    x = np.array([before[i] for i in ids])
    y = np.array([after[i] for i in ids])
    diff = y - x
    se = diff.std(ddof=1) / math.sqrt(len(ids)) if len(ids) > 1 else 0.0
    binary = bool(np.all((x == 0) | (x == 1)) and np.all((y == 0) | (y == 1)))
    b = int(np.sum((x == 1) & (y == 0))) if binary else None
    c = int(np.sum((x == 0) & (y == 1))) if binary else None
    return PairedGain(questions=len(ids), before=float(x.mean()), after=float(y.mean()),
                      gain=float(diff.mean()), ci_low=float(diff.mean() - Z_95 * se),
                      ci_high=float(diff.mean() + Z_95 * se), right_to_wrong=b,
                      wrong_to_right=c, mcnemar_p=mcnemar_exact_p(b, c) if binary else None)


def results_path(given: str | Path) -> Path:
    """A result-lines file, or the results.jsonl of a directory given instead."""
    return Path(given) / RESULTS_FILE if Path(given).is_dir() else Path(given)


def seed_mean_gain(pairs: Sequence[tuple[str | Path, str | Path]]) -> PairedGain:
    """The gain over several seeds' runs of the same questions, each question's score on each side
    averaged over the seeds first: the interval then spans the questions (200 differences, not
    600), so a question that three seeds share counts once, and the seeds' disagreement on it is
    part of its difference. With fractional scores there is no McNemar test."""
    if not pairs:
        raise PairedError("no seeds to compare")
    before: dict[str, list[float]] = {}
    after: dict[str, list[float]] = {}
    for before_path, after_path in pairs:
        for given, into in ((before_path, before), (after_path, after)):
            path = results_path(given)
            scores = question_scores(read_results(str(path)), str(path))
            if into and set(scores) != set(into):
                raise PairedError(f"{path}: not the questions of the first seed's file "
                                  f"({len(set(scores) ^ set(into))} differ)")
            for qid, score in scores.items():
                into.setdefault(qid, []).append(score)
    return paired_gain({q: float(np.mean(v)) for q, v in before.items()},
                       {q: float(np.mean(v)) for q, v in after.items()})


def _scores(given: str | Path) -> dict[str, float]:
    path = results_path(given)
    return question_scores(read_results(str(path)), str(path))


def gain_difference(a: tuple[str | Path, str | Path], b: tuple[str | Path, str | Path]
                    ) -> PairedGain:
    """How much more method a's training gained than method b's on the same questions, each given
    as (before, after) evaluations: per question, the gap a - b before and after, paired. Its
    `before` / `after` are the mean gaps, its `gain` is a's gain minus b's (the share of the final
    gap that the training between the two evaluations produced, not the start), and its interval
    spans the questions. The gaps take values in {-1, 0, 1}: no McNemar test."""
    (a_before, a_after), (b_before, b_after) = [(_scores(x), _scores(y)) for x, y in (a, b)]
    ids = set(a_before)
    for name, scores in (("a's after", a_after), ("b's before", b_before),
                         ("b's after", b_after)):
        if set(scores) != ids:
            raise PairedError(f"{name}: not the questions of a's before "
                              f"({len(set(scores) ^ ids)} differ)")
    gap_before = {q: a_before[q] - b_before[q] for q in ids}
    gap_after = {q: a_after[q] - b_after[q] for q in ids}
    # The gaps are not 0/1 scores, so paired_gain gives no McNemar counts; say so explicitly.
    return dataclasses.replace(paired_gain(gap_before, gap_after), right_to_wrong=None,
                               wrong_to_right=None, mcnemar_p=None)


def categories_of(results: Sequence[dict], by: str) -> dict[str, str]:
    """{question id: its value of category `by`} (e.g. hops -> "1"); questions without it: "-"."""
    return {r["id"]: ",".join(map(str, (r.get("categories") or {}).get(by) or ["-"]))
            for r in results}


def compare(before_path: str | Path, after_path: str | Path, by: str | None = None
            ) -> dict[str, PairedGain]:
    """{"all": gain, "<by>=<value>": gain per category} of two evaluations' result lines (files,
    or directories holding a results.jsonl)."""
    sides = []
    for given in (before_path, after_path):
        path = results_path(given)
        results = read_results(str(path))
        if not results:
            raise PairedError(f"{path}: no result lines")
        sides.append((results, question_scores(results, str(path))))
    (before_results, before), (_, after) = sides
    try:
        out = {"all": paired_gain(before, after)}
    except PairedError as error:
        raise PairedError(f"{before_path} vs {after_path}: {error}") from error
    if by:
        groups: dict[str, list[str]] = {}
        for qid, value in categories_of(before_results, by).items():
            groups.setdefault(value, []).append(qid)
        for value in sorted(groups):
            ids = groups[value]
            out[f"{by}={value}"] = paired_gain({i: before[i] for i in ids},
                                               {i: after[i] for i in ids})
    return out


def markdown_table(gains: Mapping[str, PairedGain]) -> str:
    lines = ["| questions | n | before | after | gain (points) | 95% interval | right -> wrong "
             "| wrong -> right | McNemar p |", "|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    for name, g in gains.items():
        p = "-" if g.mcnemar_p is None else f"{g.mcnemar_p:.2g}"
        b, c = ("-" if g.right_to_wrong is None else g.right_to_wrong,
                "-" if g.wrong_to_right is None else g.wrong_to_right)
        lines.append(f"| {name} | {g.questions} | {100 * g.before:.1f}% | {100 * g.after:.1f}% | "
                     f"{100 * g.gain:+.1f} | {100 * g.ci_low:+.1f} to {100 * g.ci_high:+.1f} | "
                     f"{b} | {c} | {p} |")
    return "\n".join(lines)


def _flags() -> flags.FlagValues:
    values = flags.FlagValues()
    flags.DEFINE_string("before", None, "The first evaluation's result lines (a .jsonl file, or "
                        "a directory with a results.jsonl).", flag_values=values)
    flags.DEFINE_string("after", None, "The second evaluation's result lines.", flag_values=values)
    flags.DEFINE_string("by", "hops", "A category to break the comparison down by ('' for none).",
                        flag_values=values)
    flags.DEFINE_string("out", None, "A JSON file to write the numbers to.", flag_values=values)
    flags.mark_flags_as_required(["before", "after"], flag_values=values)
    return values


def main(argv: list[str] | None = None) -> int:
    values = _flags()
    try:
        values(argv if argv is not None else sys.argv)
    except flags.Error as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        gains = compare(values.before, values.after, values.by or None)
    except PairedError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(markdown_table(gains))
    if values.out:
        Path(values.out).write_text(json.dumps(
            {"before": values.before, "after": values.after,
             **{k: g.as_dict() for k, g in gains.items()}}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
