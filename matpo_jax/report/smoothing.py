"""Smoothing of noisy per-step curves for plots: an exponential moving average, debiased like
TensorBoard's, so the first points are not pulled towards zero."""
from __future__ import annotations

import numpy as np


def ema(values: np.ndarray, weight: float) -> np.ndarray:
    """Debiased exponential moving average: out[i] = sum_j w^(i-j) (1-w) v[j] / (1 - w^(i+1)).
    Weight 0 returns the values; NaNs are skipped (they keep the previous average)."""
    values = np.asarray(values, dtype=np.float64)
    if weight <= 0 or values.size == 0:
        return values
    out, average, norm = np.empty_like(values), 0.0, 0.0
    for i, value in enumerate(values):
        if np.isfinite(value):
            average = weight * average + (1 - weight) * value
            norm = weight * norm + (1 - weight)
        out[i] = average / norm if norm else np.nan
    return out


def auto_weight(points: int) -> float:
    """An EMA weight whose span is about a tenth of the curve (at least 2 points, at most 50):
    a 30-step demo keeps its shape, a 2,000-step SFT loses its step-to-step noise."""
    span = min(max(points / 10, 2.0), 50.0)
    return 1.0 - 2.0 / (span + 1.0)
