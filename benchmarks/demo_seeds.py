"""The demo's table over seeds, read from finished run directories (no hand-copied numbers).

    python benchmarks/demo_seeds.py --runs=runs/s0,runs/s1,runs/s2 \
        --out=benchmarks/results/demo_fresh_clone_SHA.json --what="fresh clone of SHA, ..."

Per run: validation accuracy (all / 1 hop / 2 hops) after SFT and after RL (eval/sft.json,
eval/final.json), the gain (with its 95% interval over the same questions, run/eval/paired.py,
where the run wrote eval/sft_questions.jsonl and final_questions.jsonl), workers per question,
the 96-question curve (eval/stepN.json) and the run's wall time when the caller wrote `date +%s`
(or `date`, in UTC) into RUN.start and RUN.end beside it. Prints a markdown table; --out also writes everything as JSON.
"""
from __future__ import annotations

import datetime
import json
import os
import re
import sys

import numpy as np
from absl import app, flags

from matpo_jax.run.eval import paired

_RUNS = flags.DEFINE_list("runs", None, "Demo workdirs, seed order.")
_OUT = flags.DEFINE_string("out", None, "JSON to write.")
_WHAT = flags.DEFINE_string("what", "", "What was run, where (goes into the JSON).")
flags.mark_flag_as_required("runs")

KEYS = {"accuracy": "eval/accuracy", "accuracy_hop1": "eval/accuracy_hop1",
        "accuracy_hop2": "eval/accuracy_hop2"}


def _eval(run: str, name: str) -> dict:
    with open(os.path.join(run, "eval", f"{name}.json")) as f:
        return json.load(f)


def _percent(record: dict) -> dict:
    return {short: round(100 * record[key], 1) for short, key in KEYS.items()}


def _curve(run: str) -> list[tuple[int, float]]:
    points = [(0, _eval(run, "sft"))]
    for name in os.listdir(os.path.join(run, "eval")):
        step = re.fullmatch(r"step(\d+)\.json", name)
        if step:
            points.append((int(step.group(1)), _eval(run, name[:-5])))
    final = _eval(run, "final")
    if "curve/accuracy" in final:  # the final evaluation also scores the curve's questions
        with open(os.path.join(run, "config.json")) as f:
            points.append((json.load(f)["train"]["steps"], final))
    return sorted((step, round(100 * r["curve/accuracy"], 1)) for step, r in points
                  if "curve/accuracy" in r)


def _seconds(mark: str) -> float:
    """A .start/.end mark: `date +%s` (epoch seconds) or plain `date` ("Fri Dec  4 23:33:03 UTC
    2026") output."""
    text = open(mark).read().strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        stamp = datetime.datetime.strptime(text, "%a %b %d %H:%M:%S %Z %Y")
    except ValueError:
        raise SystemExit(f"{mark}: neither epoch seconds nor `date` output: {text!r}") from None
    return stamp.replace(tzinfo=datetime.timezone.utc).timestamp()


def run_summary(run: str) -> dict:
    sft, final = _eval(run, "sft"), _eval(run, "final")
    summary = {"after_sft": _percent(sft), "after_rl": _percent(final),
               "workers_per_question": [round(sft["eval/worker_calls_per_question"], 2),
                                        round(final["eval/worker_calls_per_question"], 2)],
               "curve_96": _curve(run)}
    # From the unrounded accuracies (34 of 360 questions is +9.4, not 69.2 - 59.7).
    summary["gain"] = round(100 * (final["eval/accuracy"] - sft["eval/accuracy"]), 1)
    questions = [os.path.join(run, "eval", f"{tag}_questions.jsonl") for tag in ("sft", "final")]
    if all(os.path.exists(q) for q in questions):  # runs since Dec 5: the gain question by question
        summary["paired"] = paired.compare(*questions)["all"].as_dict()
    marks = [os.path.join(os.path.dirname(run), os.path.basename(run) + s) for s in (".start", ".end")]
    if all(os.path.exists(m) for m in marks):
        start, end = (_seconds(m) for m in marks)
        summary["wall_s"] = round(end - start)
    return summary


def mean_sd(values, sign: str = "") -> str:
    values = np.asarray(values, float)
    sd = values.std(ddof=1) if len(values) > 1 else 0.0
    return f"{values.mean():{sign}.1f} ± {sd:.1f}"


def table(runs: dict[str, dict]) -> str:
    lines = ["| seed | after SFT | after MATPO | gain (points) | 95% interval | 1 hop | 2 hops "
             "| workers / question |", "|---|---|---|---|---|---|---|---|"]
    for name, r in runs.items():
        s, e, g = r["after_sft"], r["after_rl"], r.get("paired")
        interval = f"{100 * g['ci_low']:+.1f} to {100 * g['ci_high']:+.1f}" if g else "-"
        lines.append(f"| {name} | {s['accuracy']}% | {e['accuracy']}% | **{r['gain']:+.1f}** | "
                     f"{interval} | {s['accuracy_hop1']} -> {e['accuracy_hop1']} | "
                     f"{s['accuracy_hop2']} -> {e['accuracy_hop2']} | "
                     f"{r['workers_per_question'][0]} -> {r['workers_per_question'][1]} |")
    column = lambda f: [f(r) for r in runs.values()]  # noqa: E731
    lines.append(f"| mean ± sd | {mean_sd(column(lambda r: r['after_sft']['accuracy']))}% | "
                 f"{mean_sd(column(lambda r: r['after_rl']['accuracy']))}% | "
                 f"**{mean_sd(column(lambda r: r['gain']), '+')}** | | | | |")
    return "\n".join(lines)


def main(argv):
    del argv
    runs = {f"seed{i}": run_summary(run) for i, run in enumerate(_RUNS.value)}
    print(table(runs))
    if _OUT.value:
        gains = [r["gain"] for r in runs.values()]
        after = [r["after_rl"]["accuracy"] for r in runs.values()]
        start = [r["after_sft"]["accuracy"] for r in runs.values()]
        result = {"what": _WHAT.value, "runs_dirs": _RUNS.value, "runs": runs,
                  "summary": {"after_sft": mean_sd(start), "after_rl": mean_sd(after),
                              "gain": mean_sd(gains, "+"),
                              "min_gain": min(gains), "min_after_rl": min(after)},
                  "table_md": table(runs)}
        with open(_OUT.value, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {_OUT.value}")


if __name__ == "__main__":
    sys.exit(app.run(main))
