"""Copy pre-training: a short induction warm-up on the world's own corpus text, before SFT.

A tiny model clones the tool-call FORMAT of the demonstrations quickly but not the COPYING of an
entity name, page id or answer from its context: copy tokens are a few percent of the SFT tokens.
The same model learns a dense copy task in ~150 steps, so before SFT we train `sft.copy_steps`
steps on rows of sequences "span, separator, the same span" (spans of `sft.copy_span` tokens cut
from the tokenized corpus pages), with the loss on the repeat only, through the SAME train step
(objective "sft") and packing as SFT.

Checkpoint/resume: the phase runs only when SFT starts from step 0 (no SFT checkpoint), with its
own optimizer (same lr, warmup-cosine over copy_steps); its parameters become SFT's initial
parameters and SFT starts with a fresh optimizer state. Its steps are NOT counted in the SFT step
counter: a run interrupted during the phase redoes it from scratch (its batches are a pure function
of (seed, step), so it yields the same parameters); a run resumed from an SFT checkpoint skips it,
since the checkpoint's parameters already contain it.
"""
from __future__ import annotations

import json
import logging
from typing import Callable

import numpy as np

from matpo_jax.agents.trajectory import ROLE_IDS, SINGLE
from matpo_jax.trainer import loop as loop_lib
from matpo_jax.trainer import packing
from matpo_jax.trainer import step as step_lib
from matpo_jax.trainer.packing import TrainSequence
from matpo_jax.run.runtime import loop_config, numpy_rng, step_config
from matpo_jax.chat import ChatFormat

log = logging.getLogger(__name__)

SEPARATOR = "\n\n"  # between a span and its repeat


def corpus_token_stream(chat: ChatFormat, corpus_path: str) -> np.ndarray:
    """Every corpus page ("id | title\\ncontents", as the tools show it) tokenized, concatenated."""
    pieces = []
    with open(corpus_path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            text = f"{row['id']} | {row['title']}\n{row['contents']}\n"
            pieces.append(chat.tokenizer.encode(text, add_special_tokens=False))
    return np.asarray([t for p in pieces for t in p], np.int32)


def copy_sequence(stream: np.ndarray, start: int, span: int, separator: list[int],
                  rollout_id: int = 0, order: np.ndarray | None = None) -> TrainSequence:
    """stream[start:start+span] (permuted by `order`), the separator, the same span again;
    trainable on the repeat."""
    part = stream[start:start + span]
    if order is not None:
        part = part[order]
    tokens = np.concatenate([part, np.asarray(separator, np.int32), part]).astype(np.int32)
    trainable = np.zeros(len(tokens), bool)
    trainable[len(part) + len(separator):] = True
    return TrainSequence(tokens=tokens, trainable=trainable,
                         old_logprobs=np.zeros(len(tokens), np.float32), advantage=1.0,
                         role_id=ROLE_IDS[SINGLE], rollout_id=rollout_id, group_id=rollout_id)


def copy_batch(stream: np.ndarray, separator: list[int], step: int, *, seed: int, rows: int,
               max_len: int, span: int, loss_config, shuffle: bool = False) -> packing.PackedBatch:
    """The packed copy batch of one step: a pure function of (seed, step).

    shuffle: permute each span's tokens (the world's token distribution without its n-gram
    statistics), so the repeat can only be predicted by copying, not by language modelling.
    """
    span = max(1, min(span, (max_len - len(separator)) // 2, len(stream)))
    per_row = max(1, max_len // (2 * span + len(separator)))
    rng = numpy_rng(seed, 13, step)
    starts = rng.integers(0, len(stream) - span + 1, size=rows * per_row)
    seqs = [copy_sequence(stream, int(s), span, separator, rollout_id=k,
                          order=rng.permutation(span) if shuffle else None)
            for k, s in enumerate(starts)]
    bins = [list(range(r * per_row, (r + 1) * per_row)) for r in range(rows)]
    return packing.layout_bins(seqs, bins, rows, max_len, max_len, loss_config)


def copy_optimizer_config(cfg) -> step_lib.OptimizerConfig:
    steps = cfg.sft.copy_steps
    return step_lib.OptimizerConfig(learning_rate=cfg.sft.copy_lr or cfg.sft.lr,
                                    schedule="warmup_cosine", warmup_steps=min(20, steps // 10),
                                    decay_steps=steps, end_lr_ratio=0.1,
                                    weight_decay=cfg.rl.weight_decay, grad_clip=cfg.rl.grad_clip)


def copy_batches(rt, rows: int, loss_config) -> Callable[[int], packing.PackedBatch]:
    """step -> the copy batch of that step, as both the copy phase and SFT's rehearsal steps train
    on it (every `sft.copy_*` field honoured in both)."""
    cfg = rt.cfg
    stream = corpus_token_stream(rt.chat, rt.assets.corpus_path)
    separator = rt.chat.tokenizer.encode(SEPARATOR, add_special_tokens=False)
    log.info("copy batches from a %d-token corpus stream", len(stream))
    return lambda step: copy_batch(stream, separator, step, seed=cfg.train.seed, rows=rows,
                                   max_len=cfg.rl.pack_len, span=cfg.sft.copy_span,
                                   loss_config=loss_config, shuffle=cfg.sft.copy_shuffle)


def run_copy_pretraining(rt, model):
    """Trains `model` for `sft.copy_steps` copy steps; returns the trained params (nnx.State)."""
    cfg = rt.cfg
    scfg = step_config(cfg, "sft")
    loop = loop_lib.TrainLoop(loop_config(cfg, "copy", checkpoint_dir=None), model,
                              copy_optimizer_config(cfg), scfg, rt.mesh)
    batches = copy_batches(rt, packing.round_up(cfg.sft.batch_size, scfg.row_multiple(rt.mesh)),
                           scfg.loss)
    state = loop.run(lambda step, _: loop_lib.StepBatch(batches(step)))
    log.info("copy pre-training done: %d steps", cfg.sft.copy_steps)
    return state.params
