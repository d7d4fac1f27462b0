"""Gradient-norm spikes: a step whose global gradient norm exceeds SPIKE_FACTOR times the median
of the previous steps' norms (the last SPIKE_WINDOW of them), counted as the run goes.

The successors of MATPO (Dr. MAS, SRPO) claim fewer such spikes; this is the count that checks
it. It is a metric only: nothing is skipped or rescaled. The history lives in the training loop
of one process, so a resumed run starts it afresh (its count restarts at the resumed step).
"""
from __future__ import annotations

import collections
import math

import numpy as np

SPIKE_FACTOR = 3.0
SPIKE_WINDOW = 100  # steps the running median looks back over
MIN_HISTORY = 3  # a median of fewer steps says too little to call anything a spike


class SpikeCounter:
    def __init__(self, factor: float = SPIKE_FACTOR, window: int = SPIKE_WINDOW,
                 min_history: int = MIN_HISTORY):
        self.factor, self.min_history = factor, min_history
        self.history: collections.deque[float] = collections.deque(maxlen=window)
        self.count = 0

    def update(self, grad_norm: float) -> dict[str, float]:
        """Records one step's norm; returns whether it spiked, the running count and the
        median it was compared with (before this step joins the history)."""
        median = float(np.median(self.history)) if self.history else math.nan
        spike = (len(self.history) >= self.min_history and math.isfinite(grad_norm)
                 and grad_norm > self.factor * median)
        self.count += spike
        if math.isfinite(grad_norm):  # a skipped, non-finite step is not a norm to compare with
            self.history.append(float(grad_norm))
        return {"grad_norm_spike": float(spike), "grad_norm_spikes": float(self.count),
                "grad_norm_median": median}
