"""Several runs in one figure: validation accuracy against the RL step and the rollout reward,
each method's seeds as their mean, a band (min-max or ± sd) and the seeds themselves, faint.

  python -m matpo_jax.report.compare --runs=runs/s0,runs/s1,runs/s2 --out=docs/fig.png
  python -m matpo_jax.report.compare --runs="matpo:runs/m0,runs/m1;single:runs/s0,runs/s1" \\
      --out=docs/fig.png [--band=minmax|sd] [--val_key=curve/accuracy] [--title=...]

A run is a workdir (its metrics.jsonl). Validation accuracy is the validation curve
(`curve/accuracy`, run/eval/curve.py) when every run logged one, else the full evaluations
(`eval/accuracy`: after SFT and after RL). The numbers behind the figure are printed, one line per
method. Also `plot_comparison`: any metrics, mean ± sd per method (the reproduction's figure).
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from absl import flags

from matpo_jax.report import drawing
from matpo_jax.report.files import run_path
from matpo_jax.report.metrics import METRICS_FILE, load_metrics
from matpo_jax.report.seeds import SeedCurves, seed_curves
from matpo_jax.report.smoothing import auto_weight, ema

CURVE_KEY, EVAL_KEY, REWARD_KEY = "curve/accuracy", "eval/accuracy", "reward/mean"
BANDS = ("minmax", "sd")


class CompareError(ValueError):
    """A run, file or metric the comparison cannot use; the message names it."""


def parse_runs(text: str) -> dict[str, list[str]]:
    """"label:dir,dir;label:dir" (or "dir,dir": one unlabelled group) -> {label: [dirs]}."""
    groups: dict[str, list[str]] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        label, dirs = part.split(":", 1) if _has_label(part) else ("runs", part)
        label, paths = label.strip(), [d.strip() for d in dirs.split(",") if d.strip()]
        if not label or not paths:
            raise CompareError(f"--runs: {part!r} is not LABEL:DIR,DIR,... or DIR,DIR,...")
        if label in groups:
            raise CompareError(f"--runs: the label {label!r} is given twice (label each method: "
                               f"LABEL:DIR,DIR;LABEL:DIR)")
        groups[label] = paths
    if not groups:
        raise CompareError("--runs: no run directories given")
    return groups


def _has_label(part: str) -> bool:
    """A "label:" prefix, not a URI's scheme (gs://bucket/run)."""
    head, sep, rest = part.partition(":")
    return bool(sep) and not rest.startswith("//") and "," not in head and "/" not in head


def metrics_file(run_dir: str) -> str:
    """<run_dir>/metrics.jsonl, or a CompareError naming what is missing."""
    if not run_path(run_dir).is_dir():
        raise CompareError(f"run directory {run_dir} does not exist")
    path = run_path(run_dir, METRICS_FILE)
    if not path.exists():
        raise CompareError(f"{path} does not exist: {run_dir} is not a training run's workdir "
                           f"(or it has logged nothing yet)")
    return str(path)


def validation_key(paths: Sequence[str]) -> str:
    """The validation curve when every run logged one, else the full evaluations."""
    logs_curve = all(any(CURVE_KEY in r for r in load_metrics(p)) for p in paths)
    return CURVE_KEY if logs_curve else EVAL_KEY


@dataclasses.dataclass(frozen=True)
class MethodCurves:
    validation: SeedCurves
    reward: SeedCurves  # each seed smoothed (EMA of `weight`) before the mean and the band
    weight: float


def compare_runs(groups: Mapping[str, Sequence[str]], out: str | Path, *, band: str = "minmax",
                 val_key: str | None = None, smoothing: float | None = None,
                 title: str | None = None) -> dict[str, MethodCurves]:
    """Draws validation accuracy and rollout reward of every method (label -> its runs'
    metrics.jsonl) to `out`; returns the numbers drawn."""
    if band not in BANDS:
        raise CompareError(f"--band={band}: one of {', '.join(BANDS)}")
    every_path = [p for paths in groups.values() for p in paths]
    val_key = val_key or validation_key(every_path)
    curves = {label: _method_curves(paths, val_key, smoothing) for label, paths in groups.items()}
    figure, canvas, (val_axes, reward_axes) = drawing.new_figure(2, panel_size=(6.0, 4.2))
    for color, (label, method) in enumerate(curves.items()):
        _draw_method(val_axes, method.validation, label, f"C{color}", band, marker="o")
        _draw_method(reward_axes, method.reward, label, f"C{color}", band, marker=None)
    what = "validation curve" if val_key == CURVE_KEY else "full evaluations"
    drawing.decorate(val_axes, title=f"Validation accuracy ({what}: {val_key})",
                     xlabel="RL step", ylabel="fraction correct")
    drawing.decorate(reward_axes, title=f"Rollout reward ({REWARD_KEY}, smoothed per seed)",
                     xlabel="RL step", ylabel="mean over the batch's rollouts")
    spread = "min to max of the seeds" if band == "minmax" else "mean ± sd of the seeds"
    weights = sorted({round(m.weight, 2) for m in curves.values()})
    drawing.save_png(figure, canvas, out, title=title or "Seeds compared",
                     note=f"bold: mean over seeds; band: {spread}; faint: each seed; reward EMA "
                          f"weight {', '.join(f'{w:.2f}' for w in weights)}")
    return curves


def _method_curves(paths: Sequence[str], val_key: str, smoothing: float | None) -> MethodCurves:
    validation = _curves(paths, val_key)
    reward = _curves(paths, REWARD_KEY)
    weight = auto_weight(reward.steps.size) if smoothing is None else smoothing
    smoothed = np.stack([ema(values, weight) for values in reward.values])
    return MethodCurves(validation, dataclasses.replace(reward, values=smoothed), weight)


def _curves(paths: Sequence[str], key: str) -> SeedCurves:
    try:
        return seed_curves(paths, key)
    except KeyError as err:
        hint = f" (a run without the validation curve? --val_key={EVAL_KEY})" \
            if key == CURVE_KEY else ""
        raise CompareError(f"{err.args[0]}{hint}") from None
    except ValueError as err:
        raise CompareError(str(err)) from None


def _draw_method(axes, curves: SeedCurves, label: str, color: str, band: str, marker) -> None:
    for values in curves.values:
        axes.plot(curves.steps, values, color=color, alpha=drawing.RAW_ALPHA, linewidth=0.8)
    if curves.n > 1:
        drawing.band(axes, curves.steps, *curves.spread(band), color=color)
    axes.plot(curves.steps, curves.mean, color=color, linewidth=2.2, marker=marker,
              label=f"{label} (n={curves.n})")


def summary_lines(curves: Mapping[str, MethodCurves]) -> list[str]:
    """One line per method: validation accuracy at its first and last common step."""
    lines = []
    for label, method in curves.items():
        v = method.validation
        points = [f"step {v.steps[i]}: {v.mean[i]:.1%} ± {v.sd[i]:.1%} "
                  f"(min {v.low[i]:.1%}, max {v.high[i]:.1%})" for i in sorted({0, v.steps.size - 1})]
        lines.append(f"{label} (n={v.n}) {v.key}: " + "; ".join(points))
    return lines


def plot_comparison(runs: Mapping[str, Sequence[str | Path]], out_path: str | Path,
                    keys: Sequence[str] = ("accuracy",), *, smoothing: float = 0.0,
                    title: str | None = None) -> Path:
    """One panel per key; per method (label -> its seeds' metrics.jsonl files) the mean over seeds
    as a line and mean ± sd as a band (the reproduction's figure, matpo_jax.reproduce)."""
    figure, canvas, axes = drawing.new_figure(len(keys))
    for ax, key in zip(axes, keys):
        for color, (label, paths) in enumerate(runs.items()):
            curves = seed_curves(paths, key)
            mean, sd = ema(curves.mean, smoothing), ema(curves.sd, smoothing)
            drawing.band(ax, curves.steps, mean - sd, mean + sd, color=f"C{color}")
            ax.plot(curves.steps, mean, color=f"C{color}", linewidth=2,
                    label=f"{label} (n={curves.n})")
        drawing.decorate(ax, title=key, xlabel="RL step", ylabel=key)
    return drawing.save_png(figure, canvas, out_path, title=title,
                            note="line: mean over seeds; band: mean ± sd")


# ----------------------------------------------------------------------------- the command
def _flags() -> flags.FlagValues:
    values = flags.FlagValues()
    flags.DEFINE_string("runs", None, "Run workdirs: DIR,DIR,... or LABEL:DIR,DIR;LABEL:DIR,... "
                        "(one label per method; its directories are its seeds).",
                        flag_values=values)
    flags.DEFINE_string("out", None, "The PNG to write.", flag_values=values)
    flags.DEFINE_enum("band", "minmax", list(BANDS), "The band around each method's mean: the "
                      "seeds' min to max, or mean ± sample sd.", flag_values=values)
    flags.DEFINE_string("val_key", None, f"Validation metric (default: {CURVE_KEY} when every run "
                        f"logged it, else {EVAL_KEY}).", flag_values=values)
    flags.DEFINE_float("smoothing", None, "EMA weight of the reward curves (default: by the "
                       "run's length; 0: raw).", flag_values=values)
    flags.DEFINE_string("title", None, "Figure title.", flag_values=values)
    flags.mark_flags_as_required(["runs", "out"], flag_values=values)
    return values


def main(argv: list[str] | None = None) -> int:
    values = _flags()
    try:
        values(list(sys.argv if argv is None else argv))
    except flags.Error as err:
        print(f"compare: {err}\n\n{values.main_module_help()}", file=sys.stderr)
        return 2
    try:
        groups = {label: [metrics_file(d) for d in dirs]
                  for label, dirs in parse_runs(values.runs).items()}
        curves = compare_runs(groups, values.out, band=values.band, val_key=values.val_key,
                              smoothing=values.smoothing, title=values.title)
    except CompareError as err:
        print(f"compare: {err}", file=sys.stderr)
        return 1
    print("\n".join(summary_lines(curves) + [f"wrote {values.out}"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
