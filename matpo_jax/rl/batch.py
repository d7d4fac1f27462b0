"""The MATPO step on the host, config-free: scored rollouts in, the packed training batch out.

  rollouts (planners / single agents and their workers) + rewards of the planners
    -> group advantages per planner (rl/advantages.py: the G planner samples of a question form a
       group; a worker inherits its planner's scalar A_i)
    -> one TrainSequence per rollout (`sequences_from_rollouts`: the seam, the trainer's input
       type; the trainer never sees a Rollout), A_i on every trained token of the planner and of
       each of its workers, role id 0 (planner / single) or 1 (worker)
    -> per-token aggregation weights over the WHOLE batch (trainer/loss.py), so micro-batching and
       data parallelism leave the loss and its gradient unchanged
    -> rows packed first-fit-decreasing (trainer/packing.py), sequences with no gradient left out (their weights still
       count in everyone else's normaliser), the row count bucketed to few shapes.

In a multi-process run each process builds this from its own questions' rollouts (groups are
whole on a process, so advantages are local) and `gather` supplies every process's values of the
few numbers that must be global: the normalisers (summed) and the rows needed (the max, so every
process packs the same row count and the parts concatenate into one global batch).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

import numpy as np

from matpo_jax.agents.trajectory import ROLE_IDS, WORKER, Rollout
from matpo_jax.rl import advantages as adv_lib
from matpo_jax.trainer import packing
from matpo_jax.trainer.loss import LossConfig
from matpo_jax.trainer.packing import PackedBatch
from matpo_jax.trainer.setwise import NO_SET


@dataclasses.dataclass
class MatpoBatch:
    batch: PackedBatch  # role_ids, advantages, loss_weights, loss_mask, old_logprobs per token
    advantages: dict[int, float]  # scalar advantage of every rollout, by rollout_id
    metrics: dict[str, float]  # trained_sequence_frac, packing_efficiency, packed_rows


def sequences_from_rollouts(rollouts: Sequence[Rollout], advantages: Mapping[int, float],
                            with_sets: bool = False) -> list[packing.TrainSequence]:
    """TrainSequences for every rollout, each carrying its scalar advantage (and with_sets: the
    setwise ratio's set of each token, trainer/setwise.py)."""
    seqs = []
    for r in rollouts:
        if not (len(r.tokens) == len(r.trainable) == len(r.logprobs)):
            raise packing.PackingError(
                f"rollout {r.rollout_id}: {len(r.tokens)} tokens, {len(r.trainable)} trainable "
                f"flags, {len(r.logprobs)} log-probs")
        seqs.append(packing.TrainSequence(
            tokens=np.asarray(r.tokens, np.int32),
            trainable=np.asarray(r.trainable, bool),
            old_logprobs=np.asarray(r.logprobs, np.float32),
            advantage=float(advantages[r.rollout_id]),
            role_id=ROLE_IDS[r.role],
            rollout_id=r.rollout_id,
            group_id=r.parent_id if r.role == WORKER else r.rollout_id,
            set_turns=set_turns(r) if with_sets else None,
        ))
    return seqs


def set_turns(rollout: Rollout) -> np.ndarray:
    """int32 [L]: the planner turn each token's set belongs to (-1: in no set). A planner's (or
    single agent's) t-th run of sampled tokens is turn t (the engine always writes a block
    between two turns); every token of a worker is in its spawning turn's set."""
    length = len(rollout.tokens)
    if rollout.role == WORKER:
        if rollout.spawn_turn is None:
            raise ValueError(f"worker rollout {rollout.rollout_id} has no spawn_turn: the "
                             "setwise ratio (rl.ratio=setwise) needs the planner turn that "
                             "spawned it")
        return np.full(length, rollout.spawn_turn, np.int32)
    trainable = np.asarray(rollout.trainable, bool)
    starts = trainable & ~np.concatenate([[False], trainable[:-1]])
    return np.where(trainable, np.cumsum(starts) - 1, NO_SET).astype(np.int32)


def matpo_batch(rollouts: Sequence[Rollout], rewards: Mapping[int, float], *,
                loss_config: LossConfig, pack_len: int, min_rows: int = 1, row_multiple: int = 1,
                group_by: str = "planner", norm_by_std: bool = True,
                gather: Callable[[np.ndarray], np.ndarray] | None = None,
                set_classes: int | None = None,
                micro_split: tuple[int, int] | None = None,
                share_prompts: bool = False) -> MatpoBatch:
    """The packed batch of one RL step.

    rewards: the reward of every planner / single-agent rollout, by rollout_id (workers have none
    of their own). pack_len: tokens per row (a whole rollout must fit). min_rows / row_multiple:
    the smallest row count and the multiple it is rounded to (micro-batches x data-parallel
    devices). group_by / norm_by_std: see rl.advantages.assign_advantages.
    gather: values [k] -> every process's values [processes, k] (multi-process runs; min_rows and
    row_multiple are then this process's share).
    set_classes: loss_config.ratio == "setwise": the train step's mini x micro batches (each
    group's sets in one micro-batch: packing.class_bins).
    micro_split: the train step's (ppo_mini_batches, micro_batches): the rows in use then fill
    whole micro-batches and the step skips the all-padding ones (packing.fill_micro_batches_first;
    not for setwise, whose rows stay where class_bins put them).
    share_prompts: samples with one prompt hold it once per row (packing.shared_prompt_units;
    the same loss and gradient up to float rounding, fewer rows; not for setwise).
    """
    setwise = loss_config.ratio == "setwise"
    if setwise and group_by != "planner":
        raise ValueError(f"rl.ratio=setwise gives a set (a planner turn and its workers) one "
                         f"advantage; rl.group_by={group_by!r} gives workers their own: use "
                         f"rl.group_by=planner")
    if setwise and not set_classes:
        raise ValueError("rl.ratio=setwise needs set_classes (mini x micro batches)")
    set_classes = set_classes if setwise else None
    advantages = adv_lib.assign_advantages(rollouts, rewards, group_by=group_by,
                                           norm_by_std=norm_by_std)
    seqs = sequences_from_rollouts(rollouts, advantages, with_sets=setwise)
    trained = packing.trained_indices(seqs, loss_config)  # groups that all scored alike drop out
    share_prompts = share_prompts and not setwise
    needed = packing.rows_needed(seqs, trained, pack_len, set_classes, share_prompts)
    totals = None
    if gather is not None:
        local = packing.batch_totals(seqs)
        gathered = gather(np.concatenate([local.as_row(), [needed]]))
        totals = type(local).sum(gathered[:, :-1])
        needed = int(gathered[:, -1].max())
    rows = packing.bucket_rows(needed, min_rows, row_multiple)
    batch = packing.pack_sequences(seqs, pack_len, row_multiple=row_multiple, rows=rows,
                                   loss_config=loss_config, drop_inert=True, totals=totals,
                                   set_classes=set_classes, share_prompts=share_prompts)
    if micro_split is not None and not setwise:
        batch = packing.fill_micro_batches_first(batch, *micro_split)
    # Counted over the sequences that carry a gradient (not the one a batch keeps when none
    # does), so every process's counts sum to the one-process numbers.
    carrying = [i for i in trained if packing.carries_gradient(seqs[i], loss_config)]
    metrics = {"trained_sequence_frac": len(carrying) / max(len(seqs), 1),
               "packing_efficiency": batch.efficiency(), "packed_rows": rows,
               "trained_sequences": len(carrying), "sequences": len(seqs),
               "trained_tokens": int(sum(seqs[i].trainable[1:].sum() for i in carrying))}
    return MatpoBatch(batch, advantages, metrics)


def advantage_stats(rollouts: Sequence[Rollout], advantages: Mapping[int, float]
                    ) -> dict[str, float]:
    """Mean and (population) std of the rollouts' scalar advantages per role, over every rollout
    (the ones left out of the packed batch too): `advantage_mean/worker`, `advantage_std/...`."""
    by_role: dict[str, list[float]] = {}
    for r in rollouts:
        by_role.setdefault(r.role, []).append(advantages[r.rollout_id])
    out = {}
    for role, values in by_role.items():
        out[f"advantage_mean/{role}"] = float(np.mean(values))
        out[f"advantage_std/{role}"] = float(np.std(values))
    return out
