"""Supervised warm start: cross-entropy on the trainable tokens of oracle demonstrations.

It shares the RL phase's train step (objective "sft"), sharding and checkpointing. The data order is
a pure function of (seed, step), so a resumed run consumes exactly the batches it would have.
"""
from __future__ import annotations

import logging

import jax
import numpy as np

from matpo_jax.trainer import checkpoint as ckpt_lib
from matpo_jax.run import copy_pretraining as copy_lib
from matpo_jax import config as config_lib
from matpo_jax.report import metrics as metrics_lib
from matpo_jax.data import loader as loader_lib
from matpo_jax.data import synthetic_world
from matpo_jax.data.oracle import Imperfection, Oracle, default_prompts
from matpo_jax.trainer import packing
from matpo_jax.trainer import step as step_lib
from matpo_jax.run.runtime import Runtime, numpy_rng, optimizer_config, step_config
from matpo_jax.data.sft_data import (add_context_lm, copy_loss_scale, demonstration_sequences,
                                 demonstrations)
from matpo_jax.data.world_assets import question_from_record

log = logging.getLogger(__name__)


def tool_text(toolbox, name: str, max_chars: int):
    """A tool as the oracle calls it, returning the text a rollout would put in the context."""
    def call(**arguments) -> str:
        return toolbox.call(name, arguments).text[:max_chars]
    return call


def demonstration_split(cfg) -> str:
    """Where SFT demonstrations come from: the world's own `sft` split when it has one."""
    return synthetic_world.SFT_SPLIT if float(cfg.data.sft_fraction) > 0 else "train"


def demonstrated_indices(cfg, num_records: int) -> np.ndarray:
    """Which records of the demonstration split SFT turns into demonstrations (seeded)."""
    return numpy_rng(int(cfg.train.seed), 7).permutation(num_records)[: int(cfg.sft.num_demos)]


def build_sft_sequences(rt: Runtime) -> list[packing.TrainSequence]:
    cfg = rt.cfg
    source = loader_lib.open_source(rt.assets.config, rt.assets.data_dir)[demonstration_split(cfg)]
    order = demonstrated_indices(cfg, len(source))
    questions = [question_from_record(loader_lib.decode_record(source[int(i)])) for i in order]
    max_chars = int(cfg.tools.max_response_chars)
    oracle = Oracle(tool_text(rt.toolbox, "search", max_chars),
                    tool_text(rt.toolbox, "open", max_chars),
                    role_prompts=default_prompts(int(cfg.rollout.report_max_chars)),
                    imperfection=Imperfection(wasted_search=float(cfg.sft.wasted_search),
                                              wrong_open=float(cfg.sft.wrong_open)),
                    num_results=int(cfg.tools.num_results), seed=int(cfg.train.seed),
                    fact_style=str(cfg.data.fact_style))
    demos = demonstrations(oracle, questions, config_lib.sft_modes(cfg))
    seqs = demonstration_sequences(rt.chat, demos, min(int(cfg.rl.pack_len),
                                                       int(cfg.rollout.max_context)))
    log.info("SFT data: %d demonstrations -> %d sequences", len(demos), len(seqs))
    if not seqs:
        raise RuntimeError("no SFT demonstration fits in rl.pack_len / rollout.max_context")
    return seqs


def _restore_shared_start(cfg, state):
    """The SFT result of another run (`sft.init_checkpoint`), so several RL runs share one start."""
    directory = str(cfg.sft.init_checkpoint)
    with ckpt_lib.Checkpointer(directory) as shared:
        restored = shared.restore_latest(state.params)
    if restored is None:
        raise FileNotFoundError(f"sft.init_checkpoint={directory!r} holds no checkpoint")
    log.info("SFT start restored from %s (step %d); no SFT steps run here",
             directory, restored.step)
    return state.replace(params=restored.params)


def _step_bins(bins: list[list[int]], step: int, rows: int, seed: int) -> list[list[int]]:
    """The packed rows of one step: consecutive slices of a per-epoch permutation."""
    rows = min(rows, len(bins))
    per_epoch = max(1, len(bins) // rows)
    epoch, index = divmod(step, per_epoch)
    order = numpy_rng(seed, 11, epoch).permutation(len(bins))
    return [bins[int(i)] for i in order[index * rows:(index + 1) * rows]]


def _demonstration_batch(cfg, seqs, bins, step: int, rows: int, max_len: int, loss_config):
    """The packed demonstration rows of one SFT step, with the copy / context loss weights."""
    chosen = _step_bins(bins, step, rows, int(cfg.train.seed))
    chosen_seqs = [seqs[i] for b in chosen for i in b]
    local = [list(range(sum(map(len, chosen[:k])), sum(map(len, chosen[:k + 1]))))
             for k in range(len(chosen))]
    batch = packing.layout_bins(chosen_seqs, local, rows, max_len, max_len, loss_config)
    add_context_lm(batch, chosen_seqs, local, float(cfg.sft.context_lm_weight))
    copy_loss_scale(batch, chosen_seqs, local, float(cfg.sft.copy_weight))
    return batch


def run_sft(rt: Runtime, model, writer: metrics_lib.MetricsWriter):
    """Trains `cfg.sft.steps` steps (resuming if checkpoints exist); returns (graphdef, TrainState)."""
    cfg = rt.cfg
    steps, rows, seed = int(cfg.sft.steps), int(cfg.sft.batch_size), int(cfg.train.seed)
    tx = step_lib.make_optimizer(optimizer_config(cfg, "sft"))
    scfg = step_config(cfg, "sft")
    graphdef, state, shardings = step_lib.init_train_state(model, tx, rt.mesh, seed=seed)
    if cfg.sft.init_checkpoint:
        return graphdef, _restore_shared_start(cfg, state)
    checkpoints = ckpt_lib.Checkpointer(rt.path("checkpoints", "sft"),
                                        save_every=int(cfg.train.checkpoint_every) or steps,
                                        keep=int(cfg.train.keep_checkpoints),
                                        async_save=bool(cfg.train.async_checkpointing))
    restored = checkpoints.restore_latest(state.params, state.opt_state)
    start = 0
    if restored is not None:
        start = restored.step
        state = state.replace(params=restored.params, opt_state=restored.opt_state,
                              step=jax.numpy.asarray(start, jax.numpy.int32))
        log.info("SFT resumed at step %d", start)
    if start >= steps:
        checkpoints.close()
        return graphdef, state
    if start == 0 and int(cfg.sft.copy_steps) > 0:
        # Copy pre-training (copy_pretraining.py) folds into SFT's INITIAL parameters: it runs only
        # before SFT step 0 and is not counted in the SFT step counter; an SFT checkpoint already
        # contains it. SFT's optimizer state stays fresh (Adam moments do not depend on params).
        state = state.replace(params=copy_lib.run_copy_pretraining(rt, model))

    seqs = build_sft_sequences(rt)
    max_len = int(cfg.rl.pack_len)
    bins = packing.first_fit_decreasing([len(s) for s in seqs], max_len)
    # Whole rows per data-parallel device; rows beyond the data are left as padding.
    rows = packing.round_up(min(rows, len(bins)), scfg.row_multiple(rt.mesh))
    step_fn = step_lib.make_train_step(graphdef, tx, scfg, rt.mesh, shardings)
    copy_every = int(cfg.sft.copy_every)
    if copy_every:
        stream = copy_lib.corpus_token_stream(rt.chat, rt.assets.corpus_path)
        separator = rt.chat.tokenizer.encode(copy_lib.SEPARATOR, add_special_tokens=False)
    with metrics_lib.Progress(steps, initial=start, desc="sft", keys=("sft/loss",)) as bar:
        for step in range(start, steps):
            rehearsal = bool(copy_every) and step % copy_every == copy_every - 1
            if rehearsal:  # a copy batch; its loss is not an SFT metric, so it is not logged
                batch = copy_lib.copy_batch(stream, separator, step, seed=seed, rows=rows,
                                            max_len=max_len, span=int(cfg.sft.copy_span),
                                            loss_config=scfg.loss)
            else:
                batch = _demonstration_batch(cfg, seqs, bins, step, rows, max_len, scfg.loss)
            state, metrics = step_fn(state, batch)
            due = (step + 1) % int(cfg.train.log_every) == 0 or step + 1 == steps
            if due and not rehearsal:
                record = {f"sft/{k}": float(np.asarray(v)) for k, v in metrics.items()}
                record["sft/packing_efficiency"] = batch.efficiency()
                writer.write(step + 1, record)
                bar.update(record, steps=1)
            else:
                bar.update(steps=1)
            checkpoints.save(step + 1, params=state.params, opt_state=state.opt_state,
                             force=step + 1 == steps)
    checkpoints.close()
    return graphdef, state
