"""Packing planner and worker sequences into fixed-shape training rows.

The trainer's input is `TrainSequence` (tokens, trainable flags, old log-probs, one advantage,
role and group ids): rl/batch.py makes them from scored rollouts, SFT and the warm starts from
their demonstrations, so nothing here knows what a rollout is.

Rollouts have wildly different lengths (a planner ~1k tokens, its workers a few hundred), so one
sequence per row wastes most of the compute on padding. `pack_sequences` places several sequences
in one row (first-fit-decreasing), marks them with segment ids (1-based per row, 0 = padding) so
attention stays within a sequence, and restarts positions per segment. `pad_sequences` is the
one-sequence-per-row layout, kept for comparison and tests.

Shared prompts (`share_prompts`): the G samples of a question start with the same prompt (the
role's system turn and the question, or a worker's system turn and sub-task), often half of their
tokens. A row then holds that prompt once, as a prefix segment, and each sample's segment
continues it (positions go on from the prompt's end; `PackedBatch.prefix_ids` lets its tokens
attend the prefix, model/packed_attention.py). The prompt's last token is kept in every sample's
segment, so the first sampled token is still predicted inside its own segment: per token the
logits equal the unshared layout's up to float summation order, with fewer rows to compute.

The number of rows is STATIC per bucket: it is rounded up to a multiple of `row_multiple`
(micro-batches x data-parallel devices), so the jitted train step compiles once per shape bucket
and every micro-batch splits evenly over devices.

Loss weights (loss.aggregation_weights) are computed here over the WHOLE batch, before the rows are
ever split, which is what makes every aggregation mode exact under any micro-batch/device split.
The same fact lets a batch leave out sequences that carry no gradient (advantage 0 with no KL or
entropy term: a GRPO group whose samples all scored the same): their weight still counts in every
other sequence's normaliser, so the update is unchanged while its cost drops with the share of
such groups, which is most of them while accuracy is low.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import numpy as np

from matpo_jax.trainer import setwise
from matpo_jax.trainer.loss import LossConfig, WeightTotals, aggregation_weights, weight_totals


class PackingError(ValueError):
    """A sequence or batch that cannot be laid out as asked."""


@dataclasses.dataclass(frozen=True)
class TrainSequence:
    """One rollout's tokens as the trainer sees them."""

    tokens: np.ndarray  # int32 [L]
    trainable: np.ndarray  # bool [L]: sampled by the policy
    old_logprobs: np.ndarray  # float32 [L]: sampler log-probs (0 where not trainable)
    advantage: float  # the rollout's scalar advantage (a worker's is its parent's)
    role_id: int  # 0 planner / single agent, 1 worker
    rollout_id: int
    group_id: int  # the planner rollout this belongs to (itself for a planner)
    ref_logprobs: np.ndarray | None = None  # float32 [L], only when a KL term is used
    set_turns: np.ndarray | None = None  # int32 [L], setwise ratio: the token's set in its group

    def __len__(self) -> int:
        return len(self.tokens)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PackedBatch:
    """Fixed-shape [rows, max_len] training batch (numpy on the host, jax arrays in the step)."""

    tokens: np.ndarray  # int32
    positions: np.ndarray  # int32, restart at 0 per segment
    segment_ids: np.ndarray  # int32, 1-based per row, 0 = padding
    role_ids: np.ndarray  # int32, 0 planner, 1 worker (0 on padding)
    loss_mask: np.ndarray  # float32, 1 on trainable tokens that can be predicted
    advantages: np.ndarray  # float32, the sequence's scalar advantage on its loss tokens
    old_logprobs: np.ndarray  # float32
    loss_weights: np.ndarray  # float32, aggregation weight of each token over the whole batch
    rollout_ids: np.ndarray  # int32, -1 on padding
    ref_logprobs: np.ndarray | None = None
    # The train step's own log-probs of the tokens under the parameters that sampled them
    # (rl.rollout_correction: the sampler's numerics differ from the step's; METHOD 5.2).
    recomputed_logprobs: np.ndarray | None = None
    # Setwise ratio (trainer/setwise.py): each token's set anchor, its row as a distance in rows
    # and its column (a token in no set: 0 and its own column).
    set_row_delta: np.ndarray | None = None  # int32
    set_col: np.ndarray | None = None  # int32
    # Shared prompts: the segment id of the prefix segment a token's segment continues (0: none);
    # None when no row shares a prompt.
    prefix_ids: np.ndarray | None = None  # int32

    @property
    def shape(self) -> tuple[int, int]:
        return self.tokens.shape

    def efficiency(self) -> float:
        """Non-padding tokens / total slots."""
        return float((np.asarray(self.segment_ids) > 0).mean())

    def num_loss_tokens(self) -> int:
        return int(np.asarray(self.loss_mask).sum())


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def bucket_rows(needed: int, minimum: int, multiple: int) -> int:
    """Row count of a packed RL batch: powers of two above `minimum`, so a run compiles a few
    shapes, however much the rollouts' total length varies from step to step."""
    rows = max(minimum, multiple)
    while rows < needed:
        rows *= 2
    return round_up(rows, multiple)


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins of sequence indices, each bin's total length <= capacity."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    bins: list[list[int]] = []
    free: list[int] = []
    for i in order:
        for b, space in enumerate(free):
            if lengths[i] <= space:
                bins[b].append(i)
                free[b] -= lengths[i]
                break
        else:
            bins.append([i])
            free.append(capacity - lengths[i])
    return bins


# A shared prompt shorter than this stays in each sequence: a prefix segment saves little then.
MIN_SHARED_PROMPT = 16


@dataclasses.dataclass(frozen=True)
class SharedPrompt:
    """Sequences laid out side by side in one row after their common prompt, which the row holds
    once: the first `shared` tokens of every member (its prompt less the last token)."""

    members: tuple[int, ...]  # indices into the batch's sequences
    shared: int

    def length(self, seqs: Sequence["TrainSequence"]) -> int:
        return self.shared + sum(len(seqs[i]) - self.shared for i in self.members)


def _prompt_length(seq: TrainSequence) -> int:
    """Tokens before the first sampled one (the whole sequence when none is)."""
    sampled = np.flatnonzero(seq.trainable)
    return int(sampled[0]) if len(sampled) else len(seq)


def shared_prompt_units(seqs: Sequence[TrainSequence], order: Sequence[int],
                        capacity: int) -> list:
    """The sequences `order` as packing units: an index for a sequence on its own, a
    `SharedPrompt` for sequences of one role whose prompts are identical (a question's G samples,
    workers given the same sub-task). A cluster's continuations are split first-fit-decreasing
    into groups that fit a row beside the prompt; a group of one stays a plain sequence."""
    clusters: dict[tuple, list[int]] = {}
    for i in order:
        s = seqs[i]
        clusters.setdefault((s.role_id, s.tokens[:_prompt_length(s)].tobytes()), []).append(i)
    units: list = []
    for members in clusters.values():
        shared = _prompt_length(seqs[members[0]]) - 1
        if len(members) < 2 or shared < MIN_SHARED_PROMPT:
            units.extend(members)
            continue
        rests = [len(seqs[i]) - shared for i in members]
        for group in first_fit_decreasing(rests, capacity - shared):
            if len(group) == 1:
                units.append(members[group[0]])
            else:
                units.append(SharedPrompt(tuple(members[j] for j in group), shared))
    return units


def unit_length(unit, seqs: Sequence[TrainSequence]) -> int:
    return unit.length(seqs) if isinstance(unit, SharedPrompt) else len(seqs[unit])


def plain_or_shared_bins(seqs: Sequence[TrainSequence], order: Sequence[int], capacity: int,
                         share_prompts: bool) -> list[list]:
    """Rows (first-fit-decreasing) of the sequences `order`: indices, and with share_prompts
    `SharedPrompt` units."""
    units = shared_prompt_units(seqs, order, capacity) if share_prompts else list(order)
    bins = first_fit_decreasing([unit_length(u, seqs) for u in units], capacity)
    return [[units[j] for j in b] for b in bins]


def class_bins(seqs: Sequence[TrainSequence], order: Sequence[int], capacity: int,
               classes: int) -> list[list[list[int]]]:
    """Setwise packing: bins (rows) per residue class of the row index mod `classes`, every group
    (a planner and its workers) in ONE class, so its sets never span micro-batches. Groups go,
    longest first, to the class with the fewest tokens so far and are packed first-fit-decreasing
    into that class's rows."""
    groups: dict[int, list[int]] = {}
    for i in order:
        groups.setdefault(seqs[i].group_id, []).append(i)
    per_class: list[list[list[int]]] = [[] for _ in range(classes)]
    free: list[list[int]] = [[] for _ in range(classes)]
    load = [0] * classes
    for members in sorted(groups.values(), key=lambda m: -sum(len(seqs[i]) for i in m)):
        c = min(range(classes), key=lambda k: (load[k], k))
        for i in sorted(members, key=lambda i: -len(seqs[i])):
            n = len(seqs[i])
            b = next((b for b, space in enumerate(free[c]) if n <= space), None)
            if b is None:
                per_class[c].append([i])
                free[c].append(capacity - n)
            else:
                per_class[c][b].append(i)
                free[c][b] -= n
            load[c] += n
    return per_class


def _interleave(per_class: list[list[list[int]]], num_rows: int) -> list[list[int]]:
    """Class c's b-th bin becomes row b * classes + c (`_split_rows` deals row r to micro-batch
    r % (mini x micro) batches)."""
    classes = len(per_class)
    bins: list[list[int]] = [[] for _ in range(num_rows)]
    for c, class_rows in enumerate(per_class):
        for b, members in enumerate(class_rows):
            bins[b * classes + c] = members
    return bins


def rows_needed(seqs: Sequence[TrainSequence], order: Sequence[int], capacity: int,
                set_classes: int | None = None, share_prompts: bool = False) -> int:
    """Rows the sequences `order` fill at `capacity` tokens a row (setwise: whole groups per
    residue class, see `class_bins`; share_prompts: `plain_or_shared_bins`)."""
    if not set_classes:
        return len(plain_or_shared_bins(seqs, order, capacity, share_prompts))
    return set_classes * max([len(b) for b in class_bins(seqs, order, capacity, set_classes)]
                             + [0])


def _check_lengths(seqs: Sequence[TrainSequence], max_len: int) -> None:
    for s in seqs:
        if len(s) > max_len:
            raise PackingError(f"sequence of rollout {s.rollout_id} has {len(s)} tokens, more than "
                               f"max_len={max_len}; raise max_len or cap rollout context")
        if len(s) == 0:
            raise PackingError(f"sequence of rollout {s.rollout_id} is empty")


def _loss_masks(seqs: Sequence[TrainSequence]) -> list[np.ndarray]:
    # A sequence's first token has no earlier token of the same sequence to be predicted from.
    masks = []
    for s in seqs:
        m = s.trainable.astype(np.float32).copy()
        m[0] = 0.0
        masks.append(m)
    return masks


def layout_bins(seqs: Sequence[TrainSequence], bins: list[list], num_rows: int, row_len: int,
                max_len: int, loss_config: LossConfig,
                totals: WeightTotals | None = None, share_prompts: bool = False) -> PackedBatch:
    """The batch for a given assignment of sequences to rows (bins of indices into `seqs`, or of
    `SharedPrompt` units). totals: the whole batch's normalisers when `seqs` are one process's
    part (`batch_totals`). share_prompts: the batch has prefix_ids even where no row shares a
    prompt, so every step (and every process's part) has the same structure."""
    masks = _loss_masks(seqs)
    # seq-mean-token-sum-norm divides by a CONSTANT: the configured max_len (the padded length),
    # never the row length a particular batch happened to get.
    norm = loss_config.loss_agg_norm or max_len
    weights = aggregation_weights(masks, [s.group_id for s in seqs], [s.role_id for s in seqs],
                                  loss_config.loss_agg,
                                  seq_denominator=loss_config.seq_mean_denominator,
                                  norm_constant=norm, totals=totals)
    shape = (num_rows, row_len)
    batch = PackedBatch(
        tokens=np.zeros(shape, np.int32), positions=np.zeros(shape, np.int32),
        segment_ids=np.zeros(shape, np.int32), role_ids=np.zeros(shape, np.int32),
        loss_mask=np.zeros(shape, np.float32), advantages=np.zeros(shape, np.float32),
        old_logprobs=np.zeros(shape, np.float32), loss_weights=np.zeros(shape, np.float32),
        rollout_ids=np.full(shape, -1, np.int32),
        ref_logprobs=(np.zeros(shape, np.float32)
                      if any(s.ref_logprobs is not None for s in seqs) else None),
    )
    if share_prompts or any(isinstance(u, SharedPrompt) for members in bins for u in members):
        batch.prefix_ids = np.zeros(shape, np.int32)
    for row, members in enumerate(bins):
        start, segment = 0, 0
        for unit in members:
            sequences, shared, prefix = (unit,), 0, 0
            if isinstance(unit, SharedPrompt):  # the prompt once, as a segment of its own
                sequences, shared, segment = unit.members, unit.shared, segment + 1
                prefix, first = segment, seqs[unit.members[0]]
                span = slice(start, start + shared)
                batch.tokens[row, span] = first.tokens[:shared]
                batch.positions[row, span] = np.arange(shared)
                batch.segment_ids[row, span] = segment
                batch.role_ids[row, span] = first.role_id
                start += shared
            for i in sequences:
                s, segment = seqs[i], segment + 1
                n = len(s) - shared
                span, own = slice(start, start + n), slice(shared, None)
                batch.tokens[row, span] = s.tokens[own]
                batch.positions[row, span] = np.arange(shared, len(s))
                batch.segment_ids[row, span] = segment
                if prefix:
                    batch.prefix_ids[row, span] = prefix
                batch.role_ids[row, span] = s.role_id
                batch.loss_mask[row, span] = masks[i][own]
                # The scalar advantage on EVERY loss token of this sequence (worker or planner).
                batch.advantages[row, span] = masks[i][own] * np.float32(s.advantage)
                batch.old_logprobs[row, span] = s.old_logprobs[own]
                batch.loss_weights[row, span] = weights[i][own]
                batch.rollout_ids[row, span] = s.rollout_id
                if s.ref_logprobs is not None:
                    batch.ref_logprobs[row, span] = s.ref_logprobs[own]
                start += n
    if any(s.set_turns is not None for s in seqs):
        _anchor_sets(batch, seqs, bins)
    return batch


def fill_micro_batches_first(batch: PackedBatch, mini: int, micro: int) -> PackedBatch:
    """The same rows, reordered so that the rows holding tokens fill whole micro-batches of the
    train step's split (trainer/step.py `_split_rows`: row r goes to micro-batch r % (mini x
    micro) of mini-batch (r % M) // micro) and the all-padding rows are left to the last ones,
    which the step then skips. Every row keeps its mini-batch (PPO mini-batches stay the same
    shares), only its micro-batch within it changes; the loss is a sum with weights fixed over
    the whole batch, so the update is the same up to float rounding order.

    The row counts of an RL batch are powers of two (`bucket_rows`): with the rows in use spread
    over every micro-batch, as packing leaves them, about a third of each micro-batch's compute
    went to padding. Not for setwise batches (their sets address rows by distance and each
    group must keep its micro-batch: `class_bins`)."""
    if batch.set_row_delta is not None:
        raise PackingError("a setwise batch's rows cannot be reordered (set_row_delta)")
    rows = batch.tokens.shape[0]
    groups = mini * micro
    if rows % groups:
        raise PackingError(f"{rows} rows do not split into {mini} x {micro} micro-batches")
    per_micro = rows // groups
    used = (np.asarray(batch.segment_ids) > 0).any(axis=1)
    source = np.arange(rows)
    order = np.empty(rows, np.int64)  # order[target row] = source row
    for m in range(mini):
        mine = source[(source % groups) // micro == m]  # this mini-batch's rows
        # Micro-batch-major targets: the first per_micro go to its first micro-batch, and so on.
        k, j = np.divmod(np.arange(len(mine)), per_micro)
        targets = j * groups + m * micro + k
        order[targets] = np.concatenate([mine[used[mine]], mine[~used[mine]]])
    return jax.tree.map(lambda x: np.asarray(x)[order], batch)


def _anchor_sets(batch: PackedBatch, seqs: Sequence[TrainSequence], bins) -> None:
    """Points every set member at its set's anchor, the set's first token placed (row-major)."""
    rows, row_len = batch.shape
    batch.set_row_delta = np.zeros((rows, row_len), np.int32)
    batch.set_col = np.tile(np.arange(row_len, dtype=np.int32), (rows, 1))
    anchors: dict[tuple[int, int], tuple[int, int]] = {}
    for row, members in enumerate(bins):
        start = 0
        for i in members:
            s = seqs[i]
            for turn in dict.fromkeys(int(t) for t in s.set_turns if t != setwise.NO_SET):
                cols = start + np.flatnonzero(s.set_turns == turn)
                anchor_row, anchor_col = anchors.setdefault((s.group_id, turn),
                                                            (row, int(cols[0])))
                batch.set_row_delta[row, cols] = anchor_row - row
                batch.set_col[row, cols] = anchor_col
            start += len(s)


def batch_totals(seqs: Sequence[TrainSequence]) -> WeightTotals:
    """The aggregation normalisers of these sequences (all of them: inert ones count too)."""
    return weight_totals(_loss_masks(seqs), [s.group_id for s in seqs], [s.role_id for s in seqs])


def carries_gradient(seq: TrainSequence, loss_config: LossConfig) -> bool:
    """False when every loss term of the sequence is identically zero in the parameters' gradient:
    the clipped surrogate scales with the advantage, and no KL or entropy term is on."""
    return seq.advantage != 0.0 or loss_config.kl_coef > 0 or loss_config.entropy_coef > 0


def trained_indices(seqs: Sequence[TrainSequence], loss_config: LossConfig) -> list[int]:
    """Indices of the sequences a batch must hold; at least one, so a batch is never empty (the
    optimizer still takes its step, as it would on an all-zero gradient)."""
    keep = [i for i, s in enumerate(seqs) if carries_gradient(s, loss_config)]
    if not keep and seqs:
        keep = [min(range(len(seqs)), key=lambda i: len(seqs[i]))]
    return keep


def _num_rows(needed: int, row_multiple: int, rows: int | None) -> int:
    if rows is None:
        return round_up(max(needed, 1), row_multiple)
    if rows < needed:
        raise PackingError(f"the sequences need {needed} rows but rows={rows}")
    if rows % row_multiple:
        raise PackingError(f"rows={rows} is not a multiple of row_multiple={row_multiple}")
    return rows


def pack_sequences(seqs: Sequence[TrainSequence], max_len: int, *, row_multiple: int = 1,
                   rows: int | None = None, row_len_multiple: int | None = None,
                   loss_config: LossConfig,
                   drop_inert: bool = False, totals: WeightTotals | None = None,
                   set_classes: int | None = None, share_prompts: bool = False) -> PackedBatch:
    """Several sequences per row (first-fit-decreasing); rows rounded up to row_multiple.

    row_len_multiple: also pick the row length, among its multiples from the longest sequence up
    to max_len, as the one with the fewest total slots (ties: shorter rows, whose dense attention
    is cheaper). A small batch then avoids a mostly empty last row; the shape stays bucketed.
    drop_inert: leave out the sequences that carry no gradient (`carries_gradient`); the loss
    weights of the rest are those of the whole batch, so the gradient is the same.
    totals: the whole batch's normalisers when `seqs` are one process's part of it.
    set_classes: setwise ratio, the train step's mini x micro batches: each group's rows share
    one residue mod set_classes, i.e. one micro-batch (`class_bins`); the sequences must carry
    set_turns, and row_multiple and rows must be multiples of it.
    share_prompts: sequences with the same prompt hold it once per row (`shared_prompt_units`);
    not with set_classes (a set's anchor is a column of its own sequence).
    """
    _check_lengths(seqs, max_len)
    if set_classes and share_prompts:
        raise PackingError("share_prompts cannot be combined with set_classes (setwise ratio)")
    if set_classes:
        if row_multiple % set_classes or (rows is not None and rows % set_classes):
            raise PackingError(f"set_classes={set_classes} must divide row_multiple="
                               f"{row_multiple} and rows={rows}")
        if any(s.set_turns is None for s in seqs):
            raise PackingError("set_classes needs sequences with set_turns "
                               "(rl.batch.sequences_from_rollouts(with_sets=True))")
    order = trained_indices(seqs, loss_config) if drop_inert else list(range(len(seqs)))
    lengths = [len(seqs[i]) for i in order]
    candidates = [max_len]
    if row_len_multiple and lengths:
        shortest = round_up(max(lengths), row_len_multiple)
        candidates = list(range(shortest, max_len + 1, row_len_multiple)) or [max_len]
    best = None
    for row_len in candidates:
        if set_classes:
            per_class = class_bins(seqs, order, row_len, set_classes)
            needed = set_classes * max([len(b) for b in per_class] + [0])
        else:
            bins = plain_or_shared_bins(seqs, order, row_len, share_prompts)
            needed = len(bins)
        if rows is not None and needed > rows:
            continue
        num_rows = _num_rows(needed, row_multiple, rows)
        if set_classes:
            bins = _interleave(per_class, num_rows)
        if best is None or num_rows * row_len < best[0] * best[1]:
            best = (num_rows, row_len, bins)
    if best is None:  # nothing fits in `rows`: let _num_rows raise with the count at max_len
        _num_rows(rows_needed(seqs, order, max_len, set_classes, share_prompts), row_multiple,
                  rows)
    num_rows, row_len, bins = best
    return layout_bins(seqs, bins, num_rows, row_len, max_len, loss_config, totals,
                       share_prompts)


def pad_sequences(seqs: Sequence[TrainSequence], max_len: int, *, row_multiple: int = 1,
                  rows: int | None = None,
                  loss_config: LossConfig) -> PackedBatch:
    """One sequence per row, right-padded: the baseline layout."""
    _check_lengths(seqs, max_len)
    bins = [[i] for i in range(len(seqs))]
    return layout_bins(seqs, bins, _num_rows(len(bins), row_multiple, rows), max_len, max_len,
                   loss_config)
