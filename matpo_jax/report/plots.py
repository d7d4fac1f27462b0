"""PNG plots of training curves from metrics.jsonl: one run's curves, and several runs compared
(mean +- std over seeds), e.g. the single-agent vs MATPO reproduction figure.

Figures are drawn with matplotlib's object API on an Agg canvas, never through pyplot, so plotting
works headless and leaves the process-wide backend (a notebook's, say) alone.
"""
from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from matpo_jax.report.files import makedirs, run_path, write_bytes_atomic
from matpo_jax.report.metrics import load_metrics, series, split_role

# Base names (role suffix removed) of the curves worth a first look, in panel order.
# The keys the training loop logs (run.rl / rewards / agents.rollout_metrics.rollout_stats /
# evaluate).
MAIN_CURVES = ("reward/mean", "reward/accuracy", "eval/accuracy", "loss", "response_tokens_mean",
               "tool_calls_mean", "worker_calls_mean", "rollout/slot_utilisation", "sft/loss")
_NOT_METRICS = ("step", "time")


def smooth(values: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard-style debiased exponential moving average; weight 0 returns the values."""
    if weight <= 0 or values.size == 0:
        return values
    out, average, norm = np.empty_like(values), 0.0, 0.0
    for i, value in enumerate(values):
        average = weight * average + (1 - weight) * value
        norm = weight * norm + (1 - weight)
        out[i] = average / norm
    return out


def metric_groups(records: Sequence[Mapping]) -> dict[str, list[str]]:
    """Keys grouped by base name: {"tool_calls_mean": ["tool_calls_mean/planner", ".../worker"]}."""
    groups: dict[str, list[str]] = {}
    for record in records:
        for key in record:
            if key not in _NOT_METRICS:
                members = groups.setdefault(split_role(key)[0], [])
                if key not in members:
                    members.append(key)
    return groups


def plot_curves(jsonl_path: str | Path, out_dir: str | Path, keys: Sequence[str] | None = None,
                *, smoothing: float = 0.0) -> dict[str, Path]:
    """Draws each selected metric group (all roles of a metric on one axes) to <name>.png, plus
    overview.png with every selected group in a grid. `keys` are base names or full keys; None
    selects every metric for the per-metric files and the MAIN_CURVES present for the overview.
    Returns {name: path} including "overview"."""
    records = load_metrics(jsonl_path)
    groups = metric_groups(records)
    if keys is None:
        selected, overview = groups, {k: groups[k] for k in MAIN_CURVES if k in groups}
    else:
        selected = {}
        for key in keys:
            base, role = split_role(key)
            if base not in groups or (role and key not in groups[base]):
                raise KeyError(f"metric {key!r} is not in {jsonl_path}; have {sorted(groups)}")
            selected.setdefault(base, []).extend([key] if role else groups[base])
        overview = selected
    out_dir = run_path(out_dir)
    makedirs(out_dir)
    written = {}
    for name, members in selected.items():
        figure, canvas = _figure(1)
        _draw_group(figure.axes[0], records, name, members, smoothing)
        written[name] = _save(figure, canvas, out_dir / f"{_file_name(name)}.png")
    if overview:
        figure, canvas = _figure(len(overview))
        for axes, (name, members) in zip(figure.axes, overview.items()):
            _draw_group(axes, records, name, members, smoothing)
        written["overview"] = _save(figure, canvas, out_dir / "overview.png")
    return written


def aggregate_runs(paths: Sequence[str | Path], key: str):
    """(steps, mean, std, n) of `key` across runs (seeds), on the steps every run logged."""
    runs = [series(load_metrics(path), key) for path in paths]
    for path, (steps, _) in zip(paths, runs):
        if steps.size == 0:
            raise KeyError(f"metric {key!r} is not in {path}")
    common = runs[0][0]
    for steps, _ in runs[1:]:
        common = np.intersect1d(common, steps)
    if common.size == 0:
        raise ValueError(f"the runs {list(map(str, paths))} share no step that logged {key!r}")
    stacked = np.stack([values[np.searchsorted(steps, common)] for steps, values in runs])
    return common, stacked.mean(axis=0), stacked.std(axis=0), len(runs)


def plot_comparison(runs: Mapping[str, Sequence[str | Path]], out_path: str | Path,
                    keys: Sequence[str] = ("accuracy",), *, smoothing: float = 0.0,
                    title: str | None = None) -> Path:
    """One panel per key; per method (label -> its seeds' metrics.jsonl files) the mean across
    seeds as a line and mean +- std as a band."""
    figure, canvas = _figure(len(keys))
    for axes, key in zip(figure.axes, keys):
        for color, (label, paths) in enumerate(runs.items()):
            steps, mean, std, n = aggregate_runs(paths, key)
            mean, std = smooth(mean, smoothing), smooth(std, smoothing)
            axes.fill_between(steps, mean - std, mean + std, color=f"C{color}", alpha=0.25,
                              linewidth=0)
            axes.plot(steps, mean, color=f"C{color}", label=f"{label} (n={n})")
        _decorate(axes, key)
    if title:
        figure.suptitle(title)
    return _save(figure, canvas, run_path(out_path))


# ------------------------------------------------------------------------------ drawing helpers
def _figure(panels: int):
    columns = min(panels, 3)
    rows = -(-panels // columns)
    figure = Figure(figsize=(5 * columns, 3.5 * rows), dpi=100)
    canvas = FigureCanvasAgg(figure)
    figure.subplots(rows, columns, squeeze=False)
    for extra in figure.axes[panels:]:
        extra.set_visible(False)
    return figure, canvas


def _draw_group(axes, records, name: str, members: Sequence[str], smoothing: float) -> None:
    for color, key in enumerate(members):
        steps, values = series(records, key)
        label = split_role(key)[1] or key
        if smoothing > 0:  # raw values faint behind the smoothed curve
            axes.plot(steps, values, color=f"C{color}", alpha=0.25, linewidth=1)
        axes.plot(steps, smooth(values, smoothing), color=f"C{color}", label=label, linewidth=1.5)
    _decorate(axes, name)


def _decorate(axes, name: str) -> None:
    axes.set_title(name)
    axes.set_xlabel("step")
    axes.grid(alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize="small")


def _save(figure: Figure, canvas: FigureCanvasAgg, path: Path) -> Path:
    figure.tight_layout()
    png = io.BytesIO()  # drawn in memory, then written whole (a local file or one object)
    canvas.print_png(png)
    write_bytes_atomic(path, png.getvalue())
    return path


def _file_name(name: str) -> str:
    return re.sub(r"[^\w.-]+", "_", name).strip("_") or "metric"
