"""Supervised warm-start data: oracle demonstrations as trainer sequences.

Demonstrations are rendered through the SAME ChatFormat as rollouts, so the trainable mask marks
exactly the tokens a policy would have sampled (assistant turns and their closing `<|im_end|>`),
and tool outputs come from the same tool clients the rollouts call.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from matpo_jax.agents.trajectory import ROLE_IDS, PLANNER, SINGLE, WORKER
from matpo_jax.data.oracle import Demonstration, Oracle
from matpo_jax.data.synthetic_world import Question
from matpo_jax.trainer.packing import TrainSequence
from matpo_jax.chat import ChatFormat


COPY_NGRAM = 2  # a trainable token copies the context if it lies in a bigram the context holds


@dataclasses.dataclass(frozen=True)
class SFTSequence(TrainSequence):
    """A demonstration sequence plus which of its trainable tokens copy from the context."""

    copy_mask: np.ndarray | None = None  # bool [L]
    context_start: int = 0  # first token after the system prompt


def copy_token_mask(tokens, trainable, context_start: int = 0, n: int = COPY_NGRAM) -> np.ndarray:
    """Trainable tokens that repeat a span of the EARLIER non-trainable context.

    A window of n consecutive trainable tokens whose n-gram occurs among the non-trainable tokens
    before it (from `context_start`, i.e. after the system prompt, so the tool schemas' JSON
    template does not count) marks its tokens, plus the trainable token just before the run: the
    token that picks WHICH span to copy (often merged with a quote by the tokenizer). This catches
    entity names, page ids and relations in tool-call arguments, facts, reports and the answer.
    """
    tokens = np.asarray(tokens)
    trainable = np.asarray(trainable, bool)
    mask = np.zeros(len(tokens), bool)
    seen: set[tuple] = set()
    for j in range(len(tokens) - n + 1):
        window = slice(j, j + n)
        if trainable[window].all():
            if tuple(tokens[window].tolist()) in seen:
                mask[window] = True
        elif j >= context_start and not trainable[window].any():
            seen.add(tuple(tokens[window].tolist()))
    starts = np.flatnonzero(mask[1:] & ~mask[:-1]) + 1
    left = starts - 1
    mask[left[trainable[left]]] = True
    return mask


def copy_loss_scale(batch, seqs, bins, copy_weight: float) -> None:
    """Multiplies the loss weights of copy tokens by `copy_weight`, IN PLACE, renormalised.

    `batch` was laid out by `packing.layout_bins(seqs, bins, ...)`; the weights are rescaled so
    sum(loss_weights * loss_mask) is unchanged (the loss stays a weighted mean of the same mass).
    """
    if copy_weight == 1.0:
        return
    scale = np.ones(batch.loss_weights.shape, np.float32)
    for row, members in enumerate(bins):
        start = 0
        for i in members:
            n = len(seqs[i])
            copy = getattr(seqs[i], "copy_mask", None)
            if copy is not None:
                scale[row, start:start + n][copy] = copy_weight
            start += n
    w = batch.loss_weights * batch.loss_mask
    total, scaled = float(w.sum()), float((w * scale).sum())
    if scaled > 0:
        batch.loss_weights[...] = batch.loss_weights * scale * np.float32(total / scaled)


def add_context_lm(batch, seqs, bins, weight: float) -> None:
    """Adds a language-modelling loss of relative weight `weight` on the NON-trainable tokens after
    each sequence's system prompt (user turns, tool responses), IN PLACE.

    Why: a model trained from scratch has no induction ("copy what followed this token last time")
    circuit, and the few copy tokens of the assistant turns are too sparse a signal to grow one in
    a CPU budget. The tool responses repeat each entity name several times per page, the signal
    that grows induction heads in pretraining; this is the tiny model's stand-in for pretraining.
    Each context token weighs `weight` times its sequence's trainable-token weight.
    """
    if weight <= 0:
        return
    for row, members in enumerate(bins):
        start = 0
        for i in members:
            s, n = seqs[i], len(seqs[i])
            context = ~np.asarray(s.trainable, bool)
            context[:max(1, int(getattr(s, "context_start", 0)))] = False
            span = slice(start, start + n)
            base = batch.loss_weights[row, span]
            unit = float(base[np.asarray(s.trainable, bool)].max()) if s.trainable.any() else 0.0
            batch.loss_mask[row, span][context] = 1.0
            batch.loss_weights[row, span][context] = np.float32(weight * unit)
            start += n


def demonstrations(oracle: Oracle, questions: list[Question], modes: str | tuple[str, ...],
                   solved_only: bool = True) -> list[Demonstration]:
    """One demonstration per question: a planner (with its workers) or a single agent.

    Several modes take turns over the questions (question i gets modes[i % len(modes)]), so a
    ("matpo", "single") warm start teaches both ways of working at the same data budget.
    """
    modes = (modes,) if isinstance(modes, str) else tuple(modes)
    acts = [oracle.planner if mode == "matpo" else oracle.single for mode in modes]
    demos = [acts[i % len(acts)](q) for i, q in enumerate(questions)]
    return [d for d in demos if d.solved or not solved_only]


def _sequence(chat: ChatFormat, demo: Demonstration, rollout_id: int, group_id: int,
              max_len: int) -> TrainSequence | None:
    ids, trainable = chat.render(demo.messages)
    if len(ids) > max_len:  # too long for the context budget: a policy could not produce it either
        return None
    ids = np.asarray(ids, np.int32)
    trainable = np.asarray(trainable, bool)
    # The context to copy from starts after the system prompt (its first <|im_end|>).
    ends = np.flatnonzero(ids == chat.im_end_id)
    system = bool(demo.messages) and demo.messages[0]["role"] == "system"
    context_start = int(ends[0]) + 1 if system and len(ends) else 0
    return SFTSequence(tokens=ids, trainable=trainable,
                       old_logprobs=np.zeros(len(ids), np.float32), advantage=1.0,
                       role_id=ROLE_IDS[demo.role], rollout_id=rollout_id, group_id=group_id,
                       copy_mask=copy_token_mask(ids, trainable, context_start),
                       context_start=context_start)


def demonstration_sequences(chat: ChatFormat, demos: list[Demonstration],
                            max_len: int) -> list[TrainSequence]:
    """Every conversation of every demonstration (a planner's workers included) as a sequence.

    A planner whose own context or any worker's context exceeds `max_len` is dropped whole, so the
    data never teaches a delegation whose worker half is missing.
    """
    out: list[TrainSequence] = []
    next_id = 0
    for demo in demos:
        assert demo.role in (PLANNER, SINGLE, WORKER), demo.role
        group = [_sequence(chat, demo, next_id, next_id, max_len)]
        group += [_sequence(chat, w, next_id + 1 + k, next_id, max_len)
                  for k, w in enumerate(demo.workers)]
        if all(s is not None for s in group):
            out.extend(group)
        next_id += len(group)
    return out


def thin_workers(seqs: list[TrainSequence], fraction: float,
                 rng: np.random.Generator) -> list[TrainSequence]:
    """Keeps every planner / single-agent sequence and a `fraction` of the worker ones (drawn
    with `rng`), so a step's rows hold more planners' decisions.

    A pretrained model learns the worker's protocol (search, open, report) from a few dozen
    demonstrations, but whether to delegate again after a report is one token per planner turn:
    it needs many planners, and a worker conversation is ~2x a planner's length."""
    if fraction >= 1.0:
        return list(seqs)
    worker = ROLE_IDS[WORKER]
    keep = rng.random(len(seqs)) < fraction
    return [s for s, k in zip(seqs, keep) if s.role_id != worker or k]
