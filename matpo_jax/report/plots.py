"""The figures of one run, from its metrics.jsonl: a few grouped PNGs a person reads, not one per
metric (TensorBoard, <workdir>/tensorboard, keeps every metric).

  overview.png      rollout reward, validation accuracy, policy loss, learning signal
  rollouts.png      how the agents worked: tool calls, worker calls, lengths, turns, answers
  optimisation.png  gradient norm, clip fraction, learning rate, KL, entropy, seconds per step
  sft.png           the SFT warm start (from <workdir>/sft/metrics.jsonl)

Per-step training metrics are drawn as an exponential moving average over their faint raw
values; evaluations as markers: the validation curve (`curve/...`, run/eval/curve.py) joined by a
line, the full evaluations after SFT and after RL (`eval/...`) as lone markers.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

from matpo_jax.report import drawing
from matpo_jax.report.files import run_path
from matpo_jax.report.metrics import ROLES, load_metrics, series
from matpo_jax.report.smoothing import auto_weight

ROLE = "{role}"  # in a series' key: each of metrics.ROLES the run logged


@dataclasses.dataclass(frozen=True)
class Series:
    """One line of a panel: a metric key, or a key pattern with {role} (one line per role)."""
    key: str
    label: str | None = None  # legend; may use {role} and {questions} (the evaluation's size)
    style: str = "smoothed"  # smoothed | curve (evaluations joined) | markers (lone evaluations)


@dataclasses.dataclass(frozen=True)
class Panel:
    title: str
    ylabel: str
    series: tuple[Series, ...]


@dataclasses.dataclass(frozen=True)
class FigureSpec:
    name: str  # the file: <name>.png
    title: str
    panels: tuple[Panel, ...]
    xlabel: str = "RL step"


def _evaluations(metric: str) -> tuple[Series, ...]:
    """The validation curve's and the full evaluations' values of one evaluation metric."""
    return (Series(f"curve/{metric}", "validation curve ({questions} questions)", "curve"),
            Series(f"eval/{metric}", "full evaluation ({questions} questions)", "markers"))


RL_FIGURES = (
    FigureSpec("overview", "What the run learned", (
        Panel("Rollout reward (training batches)", "mean over rollouts",
              (Series("reward/mean", "reward"), Series("reward/accuracy", "accuracy"))),
        Panel("Validation accuracy", "fraction correct", _evaluations("accuracy")),
        Panel("Policy loss", "loss", (Series("loss", "loss"),)),
        Panel("Learning signal", "fraction of sequences",
              (Series("trained_sequence_frac", "with a non-zero advantage"),)),
    )),
    FigureSpec("rollouts", "How the agents worked (training rollouts; evaluations as markers)", (
        Panel("Tool calls per rollout", "calls", (Series(f"tool_calls_mean/{ROLE}"),)),
        Panel("Worker calls per planner", "subagent calls",
              (Series("worker_calls_mean/planner", "training rollouts"),)
              + _evaluations("worker_calls_per_question")),
        Panel("Response tokens per rollout", "tokens", (Series(f"response_tokens_mean/{ROLE}"),)),
        Panel("Turns per rollout", "turns", (Series(f"turns_mean/{ROLE}"),)),
        Panel("Answered (a \\boxed{} answer)", "fraction",
              (Series("reward/answered", "training rollouts"),) + _evaluations("answered")),
        Panel("Invalid tool calls", "fraction of the role's calls",
              (Series(f"invalid_tool_call_frac/{ROLE}"),)),
    )),
    FigureSpec("optimisation", "Optimisation", (
        Panel("Gradient norm", "global norm (before clipping)", (Series("grad_norm", "norm"),)),
        Panel("Clip fraction", "fraction of trained tokens", (Series(f"{ROLE}/clip_frac"),)),
        Panel("Learning rate", "lr", (Series("learning_rate", "lr"),)),
        Panel("KL", "per token",
              (Series(f"{ROLE}/approx_kl", "{role}: sampling policy to current"),
               Series(f"{ROLE}/ref_kl", "{role}: to the SFT policy"))),
        Panel("Entropy", "nats per token", (Series(f"{ROLE}/entropy"),)),
        Panel("Seconds per RL step", "s",
              (Series("time_rollout_s", "rollouts"), Series("time_batch_s", "rewards, packing"),
               Series("time_update_s", "update"))),
    )),
)
SFT_FIGURES = (
    FigureSpec("sft", "SFT warm start", (
        Panel("SFT loss", "weighted loss", (Series("sft/loss", "loss"),)),
        Panel("Token NLL per role", "nats per trained token", (Series(f"sft/{ROLE}/nll"),)),
        Panel("Gradient norm", "global norm (before clipping)", (Series("sft/grad_norm", "norm"),)),
        Panel("Learning rate", "lr", (Series("sft/learning_rate", "lr"),)),
    ), xlabel="SFT step"),
)


def plot_run(jsonl_path: str | Path, out_dir: str | Path,
             figures: Sequence[FigureSpec] = RL_FIGURES, *,
             smoothing: float | None = None) -> dict[str, Path]:
    """Draws each figure of `figures` that has data to <out_dir>/<name>.png (panels without data
    are left out). `smoothing`: the EMA weight (None: smoothing.auto_weight of the run's length,
    0: raw). Returns {name: path}."""
    records = load_metrics(jsonl_path)
    keys = {key for record in records for key in record}
    written = {}
    for spec in figures:
        panels = [(panel, lines) for panel in spec.panels
                  if (lines := _lines(panel, keys, records))]
        if not panels:
            continue
        weight = auto_weight(_longest(records, panels)) if smoothing is None else smoothing
        figure, canvas, axes = drawing.new_figure(len(panels))
        for ax, (panel, lines) in zip(axes, panels):
            for color, (series_spec, key, label) in enumerate(lines):
                _draw(ax, records, series_spec, key, label, f"C{color}", weight)
            drawing.decorate(ax, title=panel.title, xlabel=spec.xlabel, ylabel=panel.ylabel)
        note = (f"lines: moving average (EMA weight {weight:.2f}) over faint raw values"
                if weight > 0 else "lines: raw values")
        if any(s.style != "smoothed" for _, lines in panels for s, _, _ in lines):
            note += "; markers: evaluations"
        written[spec.name] = drawing.save_png(figure, canvas, run_path(out_dir, f"{spec.name}.png"),
                                              title=spec.title, note=note)
    return written


def _lines(panel: Panel, keys: set[str], records) -> list[tuple[Series, str, str]]:
    """(series, key, legend label) of every line of `panel` the run logged."""
    lines = []
    for spec in panel.series:
        roles = ROLES if ROLE in spec.key else (None,)
        for role in roles:
            key = spec.key.replace(ROLE, role) if role else spec.key
            if key in keys:
                lines.append((spec, key, _label(spec, key, role, records)))
    return lines


def _label(spec: Series, key: str, role: str | None, records) -> str:
    label = spec.label or role or key
    if "{questions}" in label:  # the evaluation's own count, e.g. curve/questions
        counts = series(records, key.rsplit("/", 1)[0] + "/questions")[1]
        label = label.replace("{questions}", f"{int(counts[-1])}" if counts.size else "?")
    return label.replace(ROLE, role or "")


def _draw(axes, records, spec: Series, key: str, label: str, color: str, weight: float) -> None:
    steps, values = drawing.finite(*series(records, key))
    if spec.style == "smoothed":
        drawing.smoothed_line(axes, steps, values, weight=weight, color=color, label=label)
    else:
        drawing.points(axes, steps, values, color=color, label=label,
                       connect=spec.style == "curve", marker="o" if spec.style == "curve" else "D")


def _longest(records, panels) -> int:
    """Points of the longest per-step series (what the automatic smoothing is sized for)."""
    lengths = [series(records, key)[0].size for _, lines in panels
               for spec, key, _ in lines if spec.style == "smoothed"]
    return max(lengths, default=0)

