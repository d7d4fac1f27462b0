"""How the rollout engine runs a batch (not what it samples): knobs for benchmarks and tests.

What is sampled (roles, G, turns, budgets, sampling) is the config's `RolloutSection`; these
options have no config field, so their defaults are declared only here.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """Scheduling, injection widths and tool concurrency of `run_rollouts`."""

    mix_roles: bool = True  # False: planners and workers decode in separate phases (baseline)
    # Static widths of the sampler's injection writes (None: sampler.default_buckets). Every
    # host call pays the smallest width >= its longest injection (longer: chunks of the last),
    # on all slots: finer widths cost compilations, save compute on prompts and re-prefills.
    injection_buckets: tuple[int, ...] | None = None
    # Rows one injection extend writes together (None: sampler.default_lanes(slots)); a host call
    # writing into n slots runs ceil(n / lanes) extends of that many rows.
    injection_lanes: int | None = None
    tool_threads: int = 16  # concurrent tool calls per host call

    def __post_init__(self):
        if self.injection_buckets is not None and (
                not self.injection_buckets or min(self.injection_buckets) <= 0):
            raise ValueError(f"EngineOptions.injection_buckets must be positive widths, got "
                             f"{self.injection_buckets}")
        for name in ("injection_lanes", "tool_threads"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"EngineOptions.{name} must be a positive integer, got "
                                 f"{value!r}")
