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

import numpy as np

from matpo_jax.agents.trajectory import ROLE_IDS, SINGLE
from matpo_jax.trainer import packing
from matpo_jax.trainer import step as step_lib
from matpo_jax.trainer.packing import TrainSequence
from matpo_jax.run.runtime import numpy_rng
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
    steps = int(cfg.sft.copy_steps)
    lr = float(cfg.sft.copy_lr) or float(cfg.sft.lr)
    return step_lib.OptimizerConfig(learning_rate=lr, schedule="warmup_cosine",
                                    warmup_steps=min(20, steps // 10), decay_steps=steps,
                                    end_lr_ratio=0.1, weight_decay=float(cfg.rl.weight_decay),
                                    grad_clip=float(cfg.rl.grad_clip))


def run_copy_pretraining(rt, model):
    """Trains `model` for `sft.copy_steps` copy steps; returns the trained params (nnx.State)."""
    from matpo_jax.report import metrics as metrics_lib
    from matpo_jax.run.runtime import step_config

    cfg = rt.cfg
    steps, seed = int(cfg.sft.copy_steps), int(cfg.train.seed)
    tx = step_lib.make_optimizer(copy_optimizer_config(cfg))
    scfg = step_config(cfg, "sft")
    graphdef, state, shardings = step_lib.init_train_state(model, tx, rt.mesh, seed=seed)
    stream = corpus_token_stream(rt.chat, rt.assets.corpus_path)
    separator = rt.chat.tokenizer.encode(SEPARATOR, add_special_tokens=False)
    rows = packing.round_up(int(cfg.sft.batch_size), scfg.row_multiple(rt.mesh))
    max_len = int(cfg.rl.pack_len)
    step_fn = step_lib.make_train_step(graphdef, tx, scfg, rt.mesh, shardings)
    log.info("copy pre-training: %d steps on a %d-token corpus stream", steps, len(stream))
    with metrics_lib.Progress(steps, desc="copy", keys=("copy/loss",)) as bar:
        for step in range(steps):
            batch = copy_batch(stream, separator, step, seed=seed, rows=rows, max_len=max_len,
                               span=int(cfg.sft.copy_span), loss_config=scfg.loss,
                               shuffle=bool(cfg.sft.copy_shuffle))
            state, metrics = step_fn(state, batch)
            if step + 1 == steps:
                log.info("copy pre-training done: loss %.3f", float(np.asarray(metrics["loss"])))
            if (step + 1) % int(cfg.train.log_every) == 0 or step + 1 == steps:
                record = {f"copy/{k}": float(np.asarray(v)) for k, v in metrics.items()}
                bar.update(record, steps=1)
            else:
                bar.update(steps=1)
    return state.params
