"""What one rollout batch is measured by: trajectory statistics (`rollout_stats`: tool use,
delegation, finish reasons, format, per role) and the decode loop's traffic (`slot_metrics`: slot
utilisation, prefills, the injection work).
"""
from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np

from matpo_jax import sampler
from matpo_jax.sampler.writes import (extend_width, prefix_store_buckets,
                                       prefix_store_shape)
from matpo_jax.agents.engine_options import EngineOptions
from matpo_jax.agents.trajectory import PLANNER, Rollout
from matpo_jax.config.sections import RolloutSection

if TYPE_CHECKING:
    from matpo_jax.agents.scheduler import SlotScheduler


def summarize(name: str, values: Iterable[float]) -> dict[str, float]:
    """{name_mean, name_min, name_max} of `values` (nothing when there are none)."""
    values = np.asarray(list(values), dtype=np.float64)
    if values.size == 0:
        return {}
    return {f"{name}_mean": float(values.mean()), f"{name}_min": float(values.min()),
            f"{name}_max": float(values.max())}


def summarize_by_role(name: str, values: Sequence[float], roles: Sequence[str]) -> dict[str, float]:
    """`summarize` per role: {name_mean/planner, ..., name_max/worker}."""
    if len(values) != len(roles):
        raise ValueError(f"{len(values)} values but {len(roles)} roles for metric {name!r}")
    out = {}
    for role in dict.fromkeys(roles):  # roles in order of first appearance
        picked = [v for v, r in zip(values, roles) if r == role]
        out.update({f"{key}/{role}": v for key, v in summarize(name, picked).items()})
    return out


def rollout_stats(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """The trajectory statistics of a batch, per role (key suffix "/<role>", which the plots
    draw side by side): lengths, turns, tool use (calls per rollout and per calling turn),
    tool-call validity and format score, worker
    calls per planner, how rollouts ended; plus the batch's invalid tool calls and tool failures."""
    roles = [r.role for r in rollouts]
    out = {}
    out.update(summarize_by_role("response_tokens", [r.num_trainable for r in rollouts], roles))
    out.update(summarize_by_role("context_tokens", [len(r.tokens) for r in rollouts], roles))
    out.update(summarize_by_role("turns", [r.num_turns for r in rollouts], roles))
    out.update(summarize_by_role("tool_calls", [len(r.tool_calls) for r in rollouts], roles))
    # Calls per turn that made any (parallel calls: > 1).
    per_turn = [(r.role, n) for r in rollouts
                for n in collections.Counter(c.turn for c in r.tool_calls).values()]
    out.update(summarize_by_role("tool_calls_per_turn", [n for _, n in per_turn],
                                 [role for role, _ in per_turn]))
    out.update(summarize_by_role("format_score", [r.format_score() for r in rollouts], roles))
    planners = [r for r in rollouts if r.role == PLANNER]
    out.update(summarize_by_role("worker_calls", [len(r.child_ids) for r in planners],
                                 [PLANNER] * len(planners)))
    for role in dict.fromkeys(roles):
        mine = [r for r in rollouts if r.role == role]
        calls = [c for r in mine for c in r.tool_calls]
        out[f"rollouts/{role}"] = float(len(mine))
        out[f"invalid_tool_call_frac/{role}"] = (
            sum(not c.valid for c in calls) / len(calls) if calls else 0.0)
        out[f"tool_failure_frac/{role}"] = (
            sum(c.tool_failed for c in calls) / len(calls) if calls else 0.0)
        for reason, count in collections.Counter(r.finish_reason or "unknown"
                                                 for r in mine).items():
            out[f"finish_{reason}_frac/{role}"] = count / len(mine)
    calls = [c for r in rollouts for c in r.tool_calls]
    out["invalid_tool_calls"] = float(sum(not c.valid for c in calls))
    out["tool_failures"] = float(sum(c.tool_failed for c in calls))
    return out


def slot_metrics(loop: sampler.SlotLoopStats, scheduler: SlotScheduler,
                 cfg: RolloutSection, options: EngineOptions) -> dict[str, float]:
    """The decode loop's counters and the scheduler's traffic over one batch."""
    stats = scheduler.stats
    return dict(
        slot_utilisation=loop.sampled_tokens / max(1, cfg.decode_slots * loop.decode_steps),
        decode_steps=loop.decode_steps, host_calls=loop.host_calls,
        sampled_tokens=loop.sampled_tokens, prefills=stats.prefills,
        prefill_tokens=stats.prefill_tokens, injected_tokens=stats.injected_tokens,
        resumed_in_place=stats.resumed_in_place, evictions=stats.evictions,
        prefix_hits=stats.prefix_hits, prefix_tokens=stats.prefix_tokens,
        extend_positions=(extend_positions(stats.injection_lengths, cfg, options)
                          + _prefix_store_positions(scheduler.prefixes, cfg, options)))


def extend_positions(lengths_per_call: Sequence[Sequence[int]], cfg: RolloutSection,
                     options: EngineOptions) -> int:
    """Token positions the sampler's injection writes computed (see sampling_writes.inject):
    per host call, the written slots are extended `lanes` at a time in slot order, each group by
    the smallest width that fits its longest write, or by chunks of the largest width; with
    lanes >= slots, all slots at once by the width that fits the call's longest write."""
    slots = cfg.decode_slots
    buckets = sampler.normalize_buckets(options.injection_buckets, cfg.max_context)
    lanes = min(options.injection_lanes or sampler.default_lanes(slots), slots)
    positions = 0
    for lengths in lengths_per_call:
        if not lengths:
            continue
        if lanes >= slots:
            positions += extend_width(max(lengths), buckets) * slots
            continue
        for start in range(0, len(lengths), lanes):
            positions += extend_width(max(lengths[start:start + lanes]), buckets) * lanes
    return positions


def _prefix_store_positions(prefixes: Sequence[Sequence[int]], cfg: RolloutSection,
                            options: EngineOptions) -> int:
    """Token positions computed once per batch for the shared prefixes: one extend per prefix,
    each at its own width among the store's (see sampling_writes.build_prefix_store)."""
    buckets = sampler.normalize_buckets(options.injection_buckets, cfg.max_context)
    lengths = [len(p) for p in prefixes]
    _, width = prefix_store_shape(lengths, buckets, cfg.max_context)
    store_buckets = prefix_store_buckets(buckets, width) if lengths else ()
    return sum(extend_width(length, store_buckets) for length in lengths)
