"""Supervised warm start: cross-entropy on the trainable tokens of oracle demonstrations.

It shares the RL phase's train step (objective "sft"), sharding and checkpointing. The data order is
a pure function of (seed, step), so a resumed run consumes exactly the batches it would have.
"""
from __future__ import annotations

import logging

import numpy as np
import optax

from matpo_jax.trainer import checkpoint as ckpt_lib
from matpo_jax.tools import clients as tools_lib
from matpo_jax.run import copy_pretraining as copy_lib
from matpo_jax.run import pretrain as pretrain_lib
from matpo_jax import config as config_lib
from matpo_jax.report import metrics as metrics_lib
from matpo_jax.data import loader as loader_lib
from matpo_jax.data import synthetic_world
from matpo_jax.data.oracle import Imperfection, Oracle, default_prompts
from matpo_jax.trainer import loop as loop_lib
from matpo_jax.trainer import packing
from matpo_jax.trainer import step as step_lib
from matpo_jax.run import provenance
from matpo_jax.run.runtime import Runtime, loop_config, numpy_rng, optimizer_config, step_config
from matpo_jax.data.sft_data import (add_context_lm, copy_loss_scale, demonstration_sequences,
                                     demonstrations, thin_workers)
from matpo_jax.data.world_assets import question_from_record

log = logging.getLogger(__name__)


# Failures that say how busy the machine or the service was, not what the world holds.
TRANSIENT_TOOL_ERRORS = frozenset({tools_lib.TIMEOUT, tools_lib.CONNECTION_ERROR,
                                   tools_lib.PROTOCOL_ERROR, tools_lib.SERVER_ERROR})


class TransientToolError(RuntimeError):
    """A tool call of a demonstration failed for a reason that may not recur on a rerun."""


def tool_text(toolbox, name: str, max_chars: int):
    """A tool as the oracle calls it, returning the text a rollout would put in the context.

    An answer such as "no page with id X" is part of the world and goes into the demonstration;
    a timeout or a dropped connection would make the SFT data depend on the machine's load, so it
    stops the run instead (a rerun resumes)."""
    def call(**arguments) -> str:
        result = toolbox.call(name, arguments)
        if not result.ok and result.error_kind in TRANSIENT_TOOL_ERRORS:
            raise TransientToolError(f"SFT demonstrations: {name}({arguments}) failed "
                                     f"({result.error_kind}): {result.text}")
        return result.text[:max_chars]
    return call


def demonstration_split(cfg) -> str:
    """Where SFT demonstrations come from: the world's own `sft` split when it has one."""
    return synthetic_world.SFT_SPLIT if cfg.data.sft_fraction > 0 else "train"


def demonstrated_indices(cfg, num_records: int) -> np.ndarray:
    """Which records of the demonstration split SFT turns into demonstrations (seeded)."""
    return numpy_rng(cfg.train.seed, 7).permutation(num_records)[: cfg.sft.num_demos]


def sft_demonstrations(rt: Runtime) -> tuple[list, list]:
    """The questions SFT demonstrates and the oracle's demonstrations of them, in the config's
    ways of working (its tool calls answered by `rt.toolbox`)."""
    cfg = rt.cfg
    source = rt.assets.source(demonstration_split(cfg))
    order = demonstrated_indices(cfg, len(source))
    questions = [question_from_record(loader_lib.decode_record(source[int(i)])) for i in order]
    max_chars = cfg.tools.max_response_chars
    oracle = Oracle(tool_text(rt.toolbox, "search", max_chars),
                    tool_text(rt.toolbox, "open", max_chars),
                    role_prompts=default_prompts(
                        cfg.rollout.report_max_chars, user_query_recap=cfg.rollout.user_query_recap,
                        final_summary=cfg.rollout.final_summary),
                    imperfection=Imperfection(wasted_search=cfg.sft.wasted_search,
                                              wrong_open=cfg.sft.wrong_open),
                    num_results=cfg.tools.num_results, seed=cfg.train.seed,
                    fact_style=cfg.data.fact_style,
                    single_states_facts=cfg.sft.single_states_facts,
                    report_fact_first=cfg.sft.report_fact_first)
    return questions, demonstrations(oracle, questions, config_lib.sft_modes(cfg))


def build_sft_sequences(rt: Runtime) -> list[packing.TrainSequence]:
    cfg = rt.cfg
    _, demos = sft_demonstrations(rt)
    seqs = demonstration_sequences(rt.chat, demos, min(cfg.rl.pack_len,
                                                       cfg.rollout.max_context))
    seqs = thin_workers(seqs, cfg.sft.worker_fraction, numpy_rng(cfg.train.seed, 17))
    log.info("SFT data: %d demonstrations -> %d sequences", len(demos), len(seqs))
    if not seqs:
        raise RuntimeError("no SFT demonstration fits in rl.pack_len / rollout.max_context")
    return seqs


def restore_shared_start(cfg, state, chat=None):
    """The SFT result of another run (`sft.init_checkpoint`), so several RL runs share one start:
    its newest checkpoint that restores (another run's directory: a damaged one is skipped, never
    moved), trained with `chat`'s tokenizer (run/provenance.py; ArtifactMismatch otherwise)."""
    directory = cfg.sft.init_checkpoint
    with ckpt_lib.Checkpointer(directory) as shared:
        restored = shared.restore_latest(state.params, set_aside=False)
    if restored is None:
        raise FileNotFoundError(f"sft.init_checkpoint={directory!r} holds no checkpoint")
    if chat is not None:
        provenance.check_tokenizer(restored.metadata.get(provenance.IDENTITY_KEY), chat.tokenizer,
                                   checkpoint=f"sft.init_checkpoint={directory} (step "
                                              f"{restored.step})",
                                   source="this run's tokenizer", config=cfg)
    # LoRA: the adapters restored belong over this run's base.
    provenance.check_base(restored.metadata.get(provenance.IDENTITY_KEY),
                          provenance.base_identity(cfg),
                          checkpoint=f"sft.init_checkpoint={directory} (step {restored.step})")
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
    chosen = _step_bins(bins, step, rows, cfg.train.seed)
    chosen_seqs = [seqs[i] for b in chosen for i in b]
    local = [list(range(sum(map(len, chosen[:k])), sum(map(len, chosen[:k + 1]))))
             for k in range(len(chosen))]
    batch = packing.layout_bins(chosen_seqs, local, rows, max_len, max_len, loss_config)
    add_context_lm(batch, chosen_seqs, local, cfg.sft.context_lm_weight)
    copy_loss_scale(batch, chosen_seqs, local, cfg.sft.copy_weight)
    return batch


def run_sft(rt: Runtime, model, writer: metrics_lib.MetricsWriter):
    """Trains `cfg.sft.steps` steps (resuming if checkpoints exist); returns (graphdef, TrainState).

    sft.steps = 0 trains nothing (copy pre-training aside) and returns the model as it is."""
    cfg = rt.cfg
    if cfg.sft.steps == 0:  # no SFT optimizer is built: its schedule needs at least one step
        graphdef, state, _ = step_lib.init_train_state(model, optax.identity(), rt.mesh,
                                                       seed=cfg.train.seed)
        if cfg.sft.init_checkpoint:
            return graphdef, restore_shared_start(cfg, state, rt.chat)
        if cfg.sft.copy_steps > 0:
            state = state.replace(params=copy_lib.run_copy_pretraining(rt, model))
        log.info("sft.steps = 0: no SFT")
        return graphdef, state
    scfg = step_config(cfg, "sft")
    loop = loop_lib.TrainLoop(loop_config(cfg, "sft", rt.path("checkpoints", "sft"), rt.chat),
                              model, optimizer_config(cfg, "sft"), scfg, rt.mesh)
    if cfg.sft.init_checkpoint:
        return loop.graphdef, restore_shared_start(cfg, loop.state, rt.chat)
    batches = _SFTBatches(rt, model, scfg)
    return loop.graphdef, loop.run(batches, writer=writer, on_start=batches.prepare)


class _SFTBatches:
    """batch_fn of the SFT loop: demonstration rows, or every `sft.copy_every`-th step a copy
    or reading batch (`sft.rehearsal`; trained but not logged as SFT). `prepare` builds the data once the loop
    knows where it resumes: a run whose SFT checkpoint is complete builds nothing."""

    def __init__(self, rt: Runtime, model, scfg):
        self.rt, self.model, self.scfg = rt, model, scfg

    def prepare(self, start: int, state):
        cfg, rt = self.rt.cfg, self.rt
        if start == 0 and cfg.sft.copy_steps > 0:
            # Copy pre-training (copy_pretraining.py) folds into SFT's INITIAL parameters: it runs
            # only before SFT step 0 and is not counted in the SFT step counter; an SFT checkpoint
            # already contains it. SFT's optimizer state stays fresh (Adam moments do not depend
            # on params).
            state = state.replace(params=copy_lib.run_copy_pretraining(rt, self.model))
        self.seqs = build_sft_sequences(rt)
        self.max_len = cfg.rl.pack_len
        self.bins = packing.first_fit_decreasing([len(s) for s in self.seqs], self.max_len)
        # Whole rows per data-parallel device; rows beyond the data are left as padding.
        self.rows = packing.round_up(min(cfg.sft.batch_size, len(self.bins)),
                                     self.scfg.row_multiple(rt.mesh))
        if cfg.sft.copy_every and cfg.sft.rehearsal == "reading":
            self.copy_batch = pretrain_lib.rehearsal_batches(rt, self.rows, self.scfg.loss)
        elif cfg.sft.copy_every:
            self.copy_batch = copy_lib.copy_batches(rt, self.rows, self.scfg.loss)
        return state

    def __call__(self, step: int, state) -> loop_lib.StepBatch:
        cfg = self.rt.cfg
        every = cfg.sft.copy_every
        if every and step % every == every - 1:
            return loop_lib.StepBatch(self.copy_batch(step), log=False)
        batch = _demonstration_batch(cfg, self.seqs, self.bins, step, self.rows, self.max_len,
                                     self.scfg.loss)
        return loop_lib.StepBatch(batch, {"sft/packing_efficiency": batch.efficiency()})
