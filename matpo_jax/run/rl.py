"""The RL phase: rollouts -> rewards -> advantages -> pack -> update, with eval and checkpoints,
one step's body in `run_rl`, top to bottom.

One RL step = one batch of questions x G samples. Each step's sampling key is a function of
(seed, step) and the question stream is a grain iterator whose position is checkpointed, so a run
restarted from any checkpoint reproduces the uninterrupted run exactly.

Several processes: every process draws the same global batch of questions (the same iterator, so
its checkpointed position is the same everywhere) and rolls out its contiguous share on its own
devices, with a process-local copy of the parameters; the packed parts, whose loss weights use
the whole batch's normalisers, form one global batch (parallel/multihost.py). Only process 0
writes the consumed-questions record.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from matpo_jax import parallel
from matpo_jax.parallel import multihost
from matpo_jax.trainer import checkpoint as ckpt_lib
from matpo_jax.report import metrics as metrics_lib
from matpo_jax.report import files
from matpo_jax.run import sft as sft_lib
from matpo_jax.agents.rollout import run_rollouts
from matpo_jax.agents.rollout_metrics import rollout_stats
from matpo_jax.data import loader as loader_lib
from matpo_jax.model import lora as lora_lib
from matpo_jax.rl import batch as batch_lib
from matpo_jax.rl import rewards as rewards_lib
from matpo_jax.trainer import loop as loop_lib
from matpo_jax.trainer import loss as loss_lib
from matpo_jax.trainer import step as step_lib
from matpo_jax.run.runtime import (Runtime, loop_config, optimizer_config, prefix_rows,
                                   reward_config, rng_for, rollout_config, step_config,
                                   tool_calls_per_turn)

log = logging.getLogger(__name__)
CONSUMED_FILE = "consumed.jsonl"


def latest_rl_step(rt: Runtime) -> int | None:
    """The newest step on disk RL will resume from, or before (None: RL has not saved yet)."""
    with ckpt_lib.Checkpointer(rt.path("checkpoints", "rl")) as checkpoints:
        return checkpoints.latest_step()


def model_state(state: step_lib.TrainState):
    """The full nnx state the sampler merges with the graphdef."""
    return nnx.merge_state(state.params, state.frozen)


def rl_batch(rt: Runtime, rollouts, golds, questions, loss_cfg, row_multiple: int):
    """Rewards, then the MATPO batch of one step's rollouts (rl/batch.py); plus their metrics.
    Several processes: this process's part (its rows, weights over the whole batch)."""
    cfg = rt.cfg
    processes = jax.process_count()
    if row_multiple % processes:
        raise ValueError(f"the packed batch's row multiple {row_multiple} (micro-batches x "
                         f"data-parallel devices) does not split over {processes} processes")
    breakdowns = rewards_lib.rollout_rewards(rollouts, golds, reward_config(cfg),
                                             questions=questions, judge=rt.judge)
    scored = batch_lib.matpo_batch(
        rollouts, rewards_lib.rewards_by_id(breakdowns), loss_config=loss_cfg,
        pack_len=cfg.rl.pack_len, min_rows=-(-cfg.rl.pack_rows // processes),
        row_multiple=row_multiple // processes, group_by=cfg.rl.group_by,
        norm_by_std=cfg.rl.norm_by_std,
        gather=multihost.allgather if processes > 1 else None,
        # setwise: a group's rows share one micro-batch of the train step's mini x micro split
        set_classes=(cfg.rl.ppo_mini_batches * cfg.rl.micro_batches
                     if cfg.rl.ratio == "setwise" else None),
        micro_split=(cfg.rl.ppo_mini_batches, cfg.rl.micro_batches),
        share_prompts=cfg.rl.share_prompts)
    metrics = rewards_lib.reward_metrics(breakdowns)
    metrics.update(scored.metrics)
    metrics.update(batch_lib.advantage_stats(rollouts, scored.advantages))
    return scored.batch, metrics


def rl_question_source(rt: Runtime):
    """The train split, less the questions SFT demonstrated when data.rl_skips_demonstrated."""
    cfg = rt.cfg
    train = rt.assets.source(cfg.data.split)
    if not cfg.data.rl_skips_demonstrated or sft_lib.demonstration_split(cfg) != cfg.data.split:
        return train
    demonstrated = set(sft_lib.demonstrated_indices(cfg, len(train)).tolist())
    rest = [i for i in range(len(train)) if i not in demonstrated]
    if len(rest) < cfg.data.batch_size:
        raise ValueError(
            f"data.rl_skips_demonstrated: sft.num_demos={cfg.sft.num_demos} of "
            f"{len(train)} train questions leaves {len(rest)} for RL, fewer than "
            f"data.batch_size={cfg.data.batch_size}; raise data.num_questions")
    log.info("RL questions: %d train questions SFT did not demonstrate", len(rest))
    return loader_lib.SubsetSource(train, rest)


def question_loader(rt: Runtime):
    """The RL question stream: batches of data.batch_size from data.split (shuffled by
    data.shuffle_seed; its position is checkpointed with the train state)."""
    cfg = rt.cfg
    return loader_lib.make_loader(cfg.data.split, cfg.data.batch_size, cfg.data.shuffle_seed,
                                  source=rl_question_source(rt))


def run_rl(rt: Runtime, graphdef, params, frozen, writer: metrics_lib.MetricsWriter,
           evaluate_fn=None):
    """Trains `cfg.train.steps` RL steps from `params` (or the newest RL checkpoint).

    evaluate_fn(graphdef, model_state, tag): the evaluation every train.eval_every steps (the
    validation curve's questions, or the whole evaluation; run/eval/curve.py)."""
    cfg = rt.cfg
    scfg = step_config(cfg, "rl")
    model = nnx.merge(graphdef, params, frozen)
    loop = loop_lib.TrainLoop(loop_config(cfg, "rl", rt.path("checkpoints", "rl"), rt.chat),
                              model, optimizer_config(cfg, "rl"), scfg, rt.mesh)
    questions = iter(question_loader(rt))
    # One jitted log-prob function serves the KL reference and the rollout correction.
    logprobs = step_lib.make_logprob_fn(loop.graphdef, scfg, rt.mesh, loop.shardings)
    with_reference = reference_logprobs(loop, scfg, logprobs,  # before a resume replaces params
                                        lora=lora_lib.has_adapters(model))
    with_recomputed = recomputed_logprobs(scfg, logprobs)
    rcfg, sampler_mesh = rollout_config(cfg), multihost.local_mesh(rt.mesh)
    # Which questions each step trained on: a resumed run must consume the same stream.
    with _consumed_record(rt) as consumed, \
            loop.session(writer=writer, data=questions) as session:
        for step in session.steps:
            t0 = time.perf_counter()
            # collect: the global batch of questions (the same on every process), this
            # process's share rolled out by the current policy on this process's devices
            step_questions = next(questions)
            share = multihost.process_slice(len(step_questions["question"]))
            texts = step_questions["question"][share]
            sampler_state = multihost.to_local(model_state(session.state), sampler_mesh)
            rollout_batch = run_rollouts(sampler_state, loop.graphdef, rt.chat, rt.toolbox, texts,
                                         rcfg, rng_for(cfg.train.seed, 1, step),
                                         question_offset=share.start,
                                         max_tool_calls_per_turn=tool_calls_per_turn(cfg),
                                         prefix_rows=prefix_rows(cfg))
            del sampler_state
            t1 = time.perf_counter()
            # score and pack: rewards, advantages, the MATPO batch over every process's rows
            batch, metrics = score_and_pack(rt, rollout_batch, step_questions, share, scfg)
            batch = with_reference(batch)
            # the step's own log-probs under the sampling parameters (rl.rollout_correction)
            batch, mismatch = with_recomputed(batch, session.state)
            metrics.update(time_rollout_s=t1 - t0, time_batch_s=time.perf_counter() - t1)
            # Process 0 logs the whole batch's statistics (multihost.combine_metrics says how).
            metrics = multihost.combine_metrics(multihost.allgather_objects(
                {k: float(v) for k, v in metrics.items()}))
            # update
            record = session.update(batch)
            record.update(metrics)
            record.update(mismatch)  # whole-batch figures already, on every process
            done = step + 1
            if evaluate_fn is not None and _evaluates_after(cfg.train, done):
                record.update(evaluate_fn(loop.graphdef, model_state(session.state),
                                          tag=f"step{done}"))
            _write_consumed(consumed, done, step_questions["id"])
            # log, save
            session.log(done, record)
            session.save(done)
    return loop.state


def score_and_pack(rt: Runtime, rollout_batch, step_questions, share: slice, scfg):
    """The global packed batch of this process's rollouts (rl_batch over its share of the
    step's questions) and their metrics: rewards, packing, advantages, trajectories, engine."""
    batch, metrics = rl_batch(rt, rollout_batch.rollouts,
                              loader_lib.golds_of(step_questions)[share],
                              step_questions["question"][share], scfg.loss,
                              scfg.row_multiple(rt.mesh))
    batch = multihost.global_rows(batch, parallel.batch_sharding(rt.mesh))
    metrics.update(rollout_stats(rollout_batch.rollouts))
    metrics.update({f"rollout/{k}": v for k, v in rollout_batch.metrics.items()
                    if np.isscalar(v)})
    return batch, metrics


def _consumed_record(rt: Runtime):
    """consumed.jsonl opened for appending (process 0; None elsewhere)."""
    return (files.open_append(rt.path(CONSUMED_FILE)) if multihost.is_primary()
            else contextlib.nullcontext())


def _write_consumed(consumed, step: int, ids) -> None:
    """One line of consumed.jsonl: the question ids step `step` (1-based) trained on."""
    if consumed is not None:  # process 0
        consumed.write(json.dumps({"step": step, "ids": list(ids)}) + "\n")
        consumed.flush()


def _evaluates_after(train, step: int) -> bool:
    """Whether step `step` (1-based) is followed by an evaluation (not the last: the run's final
    evaluation follows that)."""
    return bool(train.eval_every) and step % train.eval_every == 0 and step < train.steps


def reference_logprobs(loop: loop_lib.TrainLoop, scfg, logprobs, lora: bool = False):
    """batch -> batch with the KL term's reference log-probs (rl.kl_coef > 0; else the batch
    unchanged). The reference policy is the RL start (SFT's result), frozen: a copy, since the
    train step donates the state's buffers; a resumed run rebuilds it the same way.
    With LoRA (`lora`), the reference is the frozen base with every adapter off, computed from
    the live state by the same program: no copy of any parameter."""
    if scfg.loss.kl_coef <= 0:
        return lambda batch: batch
    if lora:
        base = step_lib.make_logprob_fn(loop.graphdef, scfg, loop.mesh, loop.shardings,
                                        adapters=False)
        return lambda batch: dataclasses.replace(
            batch, ref_logprobs=base(loop.state.params, loop.state.frozen, batch))
    copy = jax.jit(lambda p: jax.tree.map(jnp.copy, p), out_shardings=loop.shardings.params)
    reference = (copy(loop.state.params), loop.state.frozen)
    return lambda batch: dataclasses.replace(batch, ref_logprobs=logprobs(*reference, batch))


def recomputed_logprobs(scfg, logprobs):
    """(batch, state) -> (batch with the train step's own log-probs of the sampled tokens under
    `state`'s parameters, the sampler's, and the mismatch between the two: mismatch/*), with
    rl.rollout_correction = measure or tis (METHOD 5.2); off: the batch unchanged, no metrics.
    Called before the update, so `state` holds the parameters the rollouts were sampled with."""
    if scfg.loss.rollout_correction == "off":
        return lambda batch, state: (batch, {})
    mismatch = jax.jit(loss_lib.rollout_mismatch)

    def recompute(batch, state):
        recomputed = logprobs(state.params, state.frozen, batch)
        stats = mismatch(batch.old_logprobs, recomputed, batch.loss_mask)
        return (dataclasses.replace(batch, recomputed_logprobs=recomputed),
                {key: float(value) for key, value in stats.items()})

    return recompute
