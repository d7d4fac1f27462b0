"""The setwise ratio (SRPO, arXiv 2609.08452; docs/METHOD.md section 5.1).

A set is what one environment step of the planner consumes: the tokens of one planner turn and
every token of the workers that turn's subagent calls spawned (a turn without workers is a set of
its own). Members are TOKENS: with K the set's loss tokens, its ratio is
    rho_S = exp( sum_{t in S} (logp_t - logp_old_t) / sqrt(K) ),
the same number on each member, clipped once (the surrogate of section 5 with rho_S), with the
set's one advantage (every member carries its planner's A_i: rl.group_by=planner).

Host side (rl/batch.py `set_turns`): each token's set within its group, -1 (`NO_SET`) for none.
Device side (`set_log_ratios`): the per-set sums over the micro-batch. A set must lie in one
micro-batch, which the packing guarantees (`packing.class_bins`: a whole group goes to rows of one residue
class mod mini x micro batches, and `_split_rows` deals row r to micro-batch r % (mini x micro)).
Each token names its set by its set's anchor, the first member token placed: the anchor's row
as a distance in global rows (`set_row_delta`, a multiple of the stride) and its column
(`set_col`). Distances, not absolute rows, so a process's part of a multi-process batch needs no
offset, and one layout serves any split into micro-batches whose count divides the stride.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

NO_SET = -1


def set_log_ratios(log_ratio: jax.Array, mask: jax.Array, batch, stride: int) -> jax.Array:
    """[B, T] -> [B, T]: each loss token's set log-ratio, sum over the set's loss tokens of
    log_ratio / sqrt(K) (K: the set's loss tokens). `batch` is one micro-batch (its rows lie
    `stride` global rows apart, see the module docstring)."""
    if batch.set_row_delta is None or batch.set_col is None:
        raise ValueError("LossConfig.ratio='setwise' needs a batch packed with sets "
                         "(rl.ratio=setwise: packing.pack_sequences(set_classes=...))")
    rows, length = mask.shape
    row = jnp.arange(rows, dtype=jnp.int32)[:, None] + batch.set_row_delta // stride
    ids = (row * length + batch.set_col).reshape(-1)
    sums = jax.ops.segment_sum((mask * log_ratio).reshape(-1), ids, num_segments=rows * length)
    counts = jax.ops.segment_sum(mask.reshape(-1), ids, num_segments=rows * length)
    per_set = sums / jnp.sqrt(jnp.maximum(counts, 1.0))
    return per_set[ids].reshape(rows, length)
