"""Failure tables side by side: one stacked bar per evaluation, a segment per first failed step.

    python -m matpo_jax.run.eval.failure_chart --out=failures.png \
        --evals="seed 0 SFT:runs/e_sft/synthetic_multihop,seed 0 MATPO:runs/e_rl/synthetic_multihop"

Each directory holds the failures.json `python -m matpo_jax.evaluate` writes for the synthetic
world (run/eval/failures.py); the bars share the order of the steps in an episode, correct answers
first, so what RL removed shows as a segment that shrinks from one bar to the next.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Mapping

from absl import flags
from matplotlib.colors import to_rgb

from matpo_jax.report import drawing, files
from matpo_jax.run.eval import failures

# Correct first, in green; then the steps in episode order, each in a colour of its own (the same
# in every chart; no green among them).
STAGE_ORDER = (failures.CORRECT,) + tuple(s for s in failures.STAGES if s != failures.CORRECT)
_FAILURE_COLOURS = ("C0", "C1", "C3", "C4", "C5", "C6", "C7", "C8", "C9", "navy", "black")
STAGE_COLOURS = {failures.CORRECT: "tab:green",
                 **dict(zip(STAGE_ORDER[1:], _FAILURE_COLOURS))}


class ChartError(ValueError):
    """A bad --evals argument or an unreadable failures.json, in one line."""


def load_table(directory: str) -> dict:
    path = os.path.join(directory, failures.FAILURES_JSON)
    if not files.run_path(path).exists():
        raise ChartError(f"{path} does not exist (run `python -m matpo_jax.evaluate` on the "
                         "synthetic world there first)")
    return json.loads(files.run_path(path).read_text(encoding="utf-8"))


def parse_evals(text: str) -> dict[str, str]:
    """"LABEL:DIR,LABEL:DIR" -> {label: dir}, in order."""
    evals = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        label, sep, directory = part.partition(":")
        if not sep or not label.strip() or not directory.strip():
            raise ChartError(f"--evals entry {part!r}: expected LABEL:DIR")
        evals[label.strip()] = directory.strip()
    if not evals:
        raise ChartError("--evals is empty")
    return evals


def plot_failures(tables: Mapping[str, Mapping], out_path, *, title: str | None = None):
    """Stacked horizontal bars, % of each evaluation's samples per first failed step."""
    stages = [s for s in STAGE_ORDER
              if any(row["stage"] == s for t in tables.values() for row in t["rows"])]
    figure, canvas, (axes,) = drawing.new_figure(
        1, panel_size=(10.0, 1.2 + 0.45 * len(tables)))
    labels = list(tables)[::-1]  # the first evaluation on top
    left = [0.0] * len(labels)
    for stage in stages:
        shares = [100 * next((r["share"] for r in tables[label]["rows"] if r["stage"] == stage),
                             0.0) for label in labels]
        bars = axes.barh(labels, shares, left=left, color=STAGE_COLOURS[stage], label=stage,
                         height=0.6)
        red, green, blue = to_rgb(STAGE_COLOURS[stage])
        ink = "white" if 0.3 * red + 0.6 * green + 0.1 * blue < 0.45 else "black"
        for bar, share in zip(bars, shares):
            if share >= 4:  # a number where it fits
                axes.text(bar.get_x() + bar.get_width() / 2, bar.get_y() + bar.get_height() / 2,
                          f"{share:.0f}", ha="center", va="center", fontsize="x-small", color=ink)
        left = [a + b for a, b in zip(left, shares)]
    axes.set_xlim(0, 100)
    axes.set_xlabel("% of samples, by the first failed step of the gold chain")
    axes.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    counts = {int(t["samples"]) for t in tables.values()}
    note = (f"{counts.pop()} samples per bar" if len(counts) == 1 else "samples per bar: "
            + ", ".join(f"{label} {int(t['samples'])}" for label, t in tables.items()))
    return drawing.save_png(figure, canvas, out_path, title=title or "Where the answers go wrong",
                            note=note)


def _flags() -> flags.FlagValues:
    values = flags.FlagValues()
    flags.DEFINE_string("evals", None, "LABEL:DIR,LABEL:DIR,... (DIR: an evaluation's "
                        "synthetic_multihop directory, holding failures.json).", flag_values=values)
    flags.DEFINE_string("out", None, "The PNG to write.", flag_values=values)
    flags.DEFINE_string("title", None, "Figure title.", flag_values=values)
    flags.mark_flags_as_required(["evals", "out"], flag_values=values)
    return values


def main(argv: list[str] | None = None) -> int:
    values = _flags()
    try:
        values(list(sys.argv if argv is None else argv))
    except flags.Error as err:
        print(f"failure_chart: {err}\n\n{values.main_module_help()}", file=sys.stderr)
        return 2
    try:
        tables = {label: load_table(d) for label, d in parse_evals(values.evals).items()}
    except ChartError as err:
        print(f"failure_chart: {err}", file=sys.stderr)
        return 1
    print(f"wrote {plot_failures(tables, values.out, title=values.title)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
