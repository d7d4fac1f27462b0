"""The drawing primitives of every figure: a grid of panels on an Agg canvas, a smoothed curve over
its faint raw values, evaluation markers, a band, and the PNG written whole.

Figures are drawn with matplotlib's object API on an Agg canvas, never through pyplot, so plotting
works headless and leaves the process-wide backend (a notebook's, say) alone.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from matpo_jax.report.files import makedirs, run_path, write_bytes_atomic
from matpo_jax.report.smoothing import ema

RAW_ALPHA = 0.25  # raw values behind a smoothed curve, individual seeds behind their mean
BAND_ALPHA = 0.2


def new_figure(panels: int, *, columns: int | None = None, panel_size=(5.0, 3.6)):
    """(figure, canvas, axes) with `panels` axes in a grid (2 columns for 2 or 4 panels, else up
    to 3); unused cells are hidden."""
    if columns is None:
        columns = 2 if panels in (2, 4) else min(panels, 3)
    rows = -(-panels // columns)
    figure = Figure(figsize=(panel_size[0] * columns, panel_size[1] * rows + 0.6), dpi=100)
    canvas = FigureCanvasAgg(figure)
    grid = figure.subplots(rows, columns, squeeze=False).ravel()
    for extra in grid[panels:]:
        extra.set_visible(False)
    return figure, canvas, list(grid[:panels])


def smoothed_line(axes, steps, values, *, weight: float, color: str, label: str | None) -> None:
    """The EMA of `values` as the curve, the raw values faint behind it (a curve of one or two
    points is drawn raw: nothing to smooth)."""
    if weight > 0 and len(values) > 2:
        axes.plot(steps, values, color=color, alpha=RAW_ALPHA, linewidth=1)
        values = ema(values, weight)
    axes.plot(steps, values, color=color, linewidth=2, label=label)


def points(axes, steps, values, *, color: str, label: str | None, connect: bool,
           marker: str = "o") -> None:
    """Evaluations: a marker per evaluated step, joined by a thin line only when `connect` (a
    curve of evaluations; two lone evaluations are not a trend)."""
    axes.plot(steps, values, color=color, marker=marker, markersize=6 if connect else 8,
              linestyle="-" if connect else "none", linewidth=1.2, label=label, zorder=3)


def band(axes, steps, low, high, *, color: str) -> None:
    axes.fill_between(steps, low, high, color=color, alpha=BAND_ALPHA, linewidth=0)


def decorate(axes, *, title: str, xlabel: str, ylabel: str) -> None:
    axes.set_title(title, fontsize="medium")
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    axes.ticklabel_format(axis="y", useOffset=False)  # a constant lr reads 1e-4, not 1e-15+1e-4
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize="small")


def save_png(figure: Figure, canvas: FigureCanvasAgg, path, *, title: str | None = None,
             note: str | None = None) -> Path:
    """Titles the figure (a note in small type under the title), lays it out and writes the PNG
    whole (a local file by rename, or one object)."""
    if title:
        figure.suptitle(title, fontsize="large", y=0.995)
    if note:
        figure.text(0.5, 0.005, note, ha="center", va="bottom", fontsize="small", color="0.35")
    # tight_layout makes room for the suptitle itself; the note needs about a line at the foot
    figure.tight_layout(rect=(0, 0.3 / figure.get_figheight() if note else 0, 1, 1))
    png = io.BytesIO()  # drawn in memory, then written whole
    canvas.print_png(png)
    path = run_path(path)
    makedirs(path.parent)
    write_bytes_atomic(path, png.getvalue())
    return path


def finite(steps: np.ndarray, values: np.ndarray):
    """The points with a finite value (a NaN logged for "not measured this step" draws nothing)."""
    keep = np.isfinite(values)
    return steps[keep], values[keep]
