"""What one rollout batch is measured by: trajectory statistics (tool use, delegation, finish
reasons, format) and the decode loop's traffic (slot utilisation, prefills, the injection work).
"""
from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Sequence

import numpy as np

from matpo_jax import sampler
from matpo_jax.sampler.writes import (extend_width, prefix_store_buckets,
                                       prefix_store_shape)
from matpo_jax.agents.engine_options import EngineOptions
from matpo_jax.agents.trajectory import PLANNER, SINGLE, WORKER, Rollout
from matpo_jax.config.sections import RolloutSection

if TYPE_CHECKING:
    from matpo_jax.agents.scheduler import SlotScheduler


def rollout_metrics(rollouts: Sequence[Rollout], cfg: RolloutSection) -> dict[str, float]:
    """Counts and means over one batch: tool use, delegation, finish reasons, format errors."""
    top = [r for r in rollouts if r.role in (PLANNER, SINGLE)]
    workers = [r for r in rollouts if r.role == WORKER]
    metrics: dict[str, float] = {"num_top_level": len(top), "num_workers": len(workers)}
    for role, group in ((top[0].role if top else cfg.mode, top), (WORKER, workers)):
        if not group:
            continue
        metrics[f"{role}/tool_calls_per_rollout"] = float(np.mean([len(r.tool_calls)
                                                                   for r in group]))
        metrics[f"{role}/turns_per_rollout"] = float(np.mean([r.num_turns for r in group]))
        metrics[f"{role}/malformed_tool_calls"] = sum(not c.valid for r in group
                                                      for c in r.tool_calls)
        metrics[f"{role}/tool_failures"] = sum(c.tool_failed for r in group for c in r.tool_calls)
        metrics[f"{role}/format_score"] = float(np.mean([r.format_score() for r in group]))
        metrics[f"{role}/trainable_tokens"] = sum(r.num_trainable for r in group)
        for reason, count in collections.Counter(r.finish_reason for r in group).items():
            metrics[f"{role}/finish/{reason}"] = count
    if cfg.mode == "matpo" and top:
        metrics["worker_calls_per_planner"] = float(np.mean([len(r.child_ids) for r in top]))
    metrics["malformed_tool_calls"] = sum(not c.valid for r in rollouts for c in r.tool_calls)
    metrics["tool_failures"] = sum(c.tool_failed for r in rollouts for c in r.tool_calls)
    return metrics


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
