"""One metric of several runs (seeds of one method) on the steps they all logged: the numbers a
comparison figure draws (mean, sample standard deviation, min and max per step)."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

import numpy as np

from matpo_jax.report.metrics import load_metrics, series


@dataclasses.dataclass(frozen=True)
class SeedCurves:
    """`key` of each run at `steps`: values[run, step]."""
    key: str
    runs: tuple[str, ...]
    steps: np.ndarray
    values: np.ndarray

    @property
    def n(self) -> int:
        return len(self.runs)

    @property
    def mean(self) -> np.ndarray:
        return self.values.mean(axis=0)

    @property
    def sd(self) -> np.ndarray:
        """Sample standard deviation over the runs (ddof 1, as the README's mean ± sd; 0 for one
        run)."""
        return self.values.std(axis=0, ddof=1) if self.n > 1 else np.zeros(self.steps.size)

    @property
    def low(self) -> np.ndarray:
        return self.values.min(axis=0)

    @property
    def high(self) -> np.ndarray:
        return self.values.max(axis=0)

    def spread(self, band: str) -> tuple[np.ndarray, np.ndarray]:
        """(lower, upper) edge of the band: "minmax" (the runs' range) or "sd" (mean ± sd)."""
        if band == "minmax":
            return self.low, self.high
        if band == "sd":
            return self.mean - self.sd, self.mean + self.sd
        raise ValueError(f"band {band!r}: minmax or sd")


def seed_curves(paths: Sequence[str | Path], key: str) -> SeedCurves:
    """`key` of every metrics.jsonl of `paths` on the steps all of them logged (a run still going,
    or one that logged an evaluation at fewer steps, limits the common steps)."""
    runs = [series(load_metrics(path), key) for path in paths]
    for path, (steps, _) in zip(paths, runs):
        if steps.size == 0:
            raise KeyError(f"metric {key!r} is not in {path}")
    common = runs[0][0]
    for steps, _ in runs[1:]:
        common = np.intersect1d(common, steps)
    if common.size == 0:
        raise ValueError(f"the runs {[str(p) for p in paths]} share no step that logged {key!r}")
    values = np.stack([values[np.searchsorted(steps, common)] for steps, values in runs])
    return SeedCurves(key, tuple(str(p) for p in paths), common, values)
