"""Group-relative advantages and their assignment to rollouts, docs/METHOD.md section 4.

`group_by="planner"` (MATPO): the G planner rollouts of a query form the group; workers are not in
the statistics and every worker inherits its parent's SCALAR advantage, which packing then puts on
each of the worker's trainable tokens. (The reference release copied the planner's per-token
advantage tensor onto worker rows element-wise, dropping the advantage wherever the planner's own
mask was 0; a scalar per rollout makes that impossible by construction.)

`group_by="role"` (AT-GRPO-style ablation): planners are grouped by query exactly as above; the
workers of a query form a second group, keyed (query, role). A worker has no outcome of its own,
so its reward is its parent's reward; the group statistics are then taken over worker rollouts,
which weights a planner by how many workers it spawned. A query's worker group of size 1 falls
back to mean 0, std 1 like any singleton group.

`group_by="agent"` (Dr. MAS, arXiv 2602.08847, agent-wise normalisation): each agent's advantage
is normalised by that agent's own reward statistics within the question's group, keyed (query,
agent), and, as in Dr. MAS's default (trajectory-level statistics), each trajectory in which the
agent acted contributes its reward ONCE. The planner agent acts in all G trajectories, so its
statistics are those of 4.1. The worker agent acts in the trajectories whose planner spawned at
least one worker; the worker statistics run over those planners' rewards, one entry per planner
however many workers it spawned. That is where it differs from "role", whose statistics have one
entry per worker rollout: the two agree exactly when every delegating planner of a question
spawned the same number of workers (docs/METHOD.md section 4.5).
"""
from __future__ import annotations

import collections
from typing import Mapping, Sequence

import numpy as np

from matpo_jax.agents.trajectory import WORKER, Rollout

GROUP_BY = ("planner", "role", "agent")
STD_EPS = 1e-6


def group_advantages(rewards: Sequence[float], norm_by_std: bool = True) -> np.ndarray:
    """(r - mean) / (unbiased std + 1e-6); a group of one uses mean 0, std 1 (veRL semantics).

    norm_by_std=False gives r - mean (Dr.GRPO)."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 1 or r.size == 0:
        raise ValueError(f"group rewards must be a non-empty vector, got shape {r.shape}")
    if r.size == 1:
        mean, std = 0.0, 1.0
    else:
        mean, std = r.mean(), r.std(ddof=1)
    centered = r - mean
    return (centered / (std + STD_EPS) if norm_by_std else centered).astype(np.float32)


def _grouped_advantages(keys: Sequence, rewards: Sequence[float],
                        norm_by_std: bool) -> list[float]:
    """Advantage of each item, groups formed by equal keys."""
    members: dict = collections.defaultdict(list)
    for i, key in enumerate(keys):
        members[key].append(i)
    out = [0.0] * len(keys)
    for idx in members.values():
        for i, a in zip(idx, group_advantages([rewards[i] for i in idx], norm_by_std)):
            out[i] = float(a)
    return out


def assign_advantages(rollouts: Sequence[Rollout], rewards: Mapping[int, float],
                      group_by: str = "planner", norm_by_std: bool = True) -> dict[int, float]:
    """Scalar advantage of every rollout (planners, single agents and workers), by rollout_id.

    rewards holds the reward of each planner/single rollout (rewards.rollout_rewards)."""
    if group_by not in GROUP_BY:
        raise ValueError(f"group_by={group_by!r}, expected one of {GROUP_BY}")
    owners = [r for r in rollouts if r.role != WORKER]
    workers = [r for r in rollouts if r.role == WORKER]
    missing = [r.rollout_id for r in owners if r.rollout_id not in rewards]
    if missing:
        raise KeyError(f"no reward for planner rollouts {missing[:10]}")
    orphans = [w.rollout_id for w in workers if w.parent_id not in rewards]
    if orphans:
        raise KeyError(f"workers {orphans[:10]} have no parent planner among the rewarded rollouts")

    owner_adv = _grouped_advantages([r.query_index for r in owners],
                                    [rewards[r.rollout_id] for r in owners], norm_by_std)
    advantages = {r.rollout_id: a for r, a in zip(owners, owner_adv)}
    if group_by == "planner":
        for w in workers:
            advantages[w.rollout_id] = advantages[w.parent_id]
    elif group_by == "agent":
        advantages.update(_agent_worker_advantages(workers, rewards, norm_by_std))
    else:
        worker_adv = _grouped_advantages([(w.query_index, w.role) for w in workers],
                                         [rewards[w.parent_id] for w in workers], norm_by_std)
        advantages.update({w.rollout_id: a for w, a in zip(workers, worker_adv)})
    return advantages


def _agent_worker_advantages(workers: Sequence[Rollout], rewards: Mapping[int, float],
                             norm_by_std: bool) -> dict[int, float]:
    """Dr. MAS's worker-agent advantages: per query, the statistics of the rewards of the
    planners that delegated (each planner once); every worker gets its parent's normalised
    reward."""
    parents = list(dict.fromkeys(w.parent_id for w in workers))  # each delegating planner once
    query_of = {w.parent_id: w.query_index for w in workers}
    parent_adv = _grouped_advantages([query_of[p] for p in parents],
                                     [rewards[p] for p in parents], norm_by_std)
    by_parent = dict(zip(parents, parent_adv))
    return {w.rollout_id: by_parent[w.parent_id] for w in workers}


def token_advantages(advantage: float, trainable: Sequence[bool]) -> np.ndarray:
    """The rollout's scalar advantage on every one of ITS OWN trainable tokens (0 elsewhere)."""
    return np.where(np.asarray(trainable, dtype=bool), np.float32(advantage), np.float32(0.0))
