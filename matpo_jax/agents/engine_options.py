"""How the rollout engine runs a batch (not what it samples): knobs for benchmarks and tests.

What is sampled (roles, G, turns, budgets, sampling) is the config's `RolloutSection`; these
options have no config field, so their defaults are declared only here (injection_lanes
excepted: left None, `rollout.injection_lanes` sets it).
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
    # Rows one injection extend writes together (None: rollout.injection_lanes, whose 0 means
    # sampler.default_lanes(slots)); a host call writing into n slots runs ceil(n / lanes)
    # extends of that many rows.
    injection_lanes: int | None = None
    tool_threads: int = 16  # concurrent tool calls per host call
    # The longest the engine waits for one search/open call, from its submission: past it the
    # call is answered with an error text and counted (`tool_timeouts`); its thread is left to
    # finish on its own. The clients' own deadline (HttpPolicy.deadline_s) should come first.
    tool_timeout_s: float = 300.0

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
        timeout = self.tool_timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
                or not 0 < timeout < float("inf"):
            raise ValueError(f"EngineOptions.tool_timeout_s must be a positive number of seconds, "
                             f"got {self.tool_timeout_s!r}")
