"""The RL phase: rollouts -> rewards -> advantages -> pack -> update, with eval and checkpoints.

One RL step = one batch of questions x G samples. Each step's sampling key is a function of
(seed, step) and the question stream is a grain iterator whose position is checkpointed, so a run
restarted from any checkpoint reproduces the uninterrupted run exactly.
"""
from __future__ import annotations

import json
import logging
import time

import jax
import numpy as np
from flax import nnx

from matpo_jax.trainer import checkpoint as ckpt_lib
from matpo_jax.report import metrics as metrics_lib
from matpo_jax.run import sft as sft_lib
from matpo_jax.agents.rollout import run_rollouts
from matpo_jax.data import loader as loader_lib
from matpo_jax.rl import advantages as adv_lib
from matpo_jax.trainer import packing
from matpo_jax.rl import rewards as rewards_lib
from matpo_jax.trainer import step as step_lib
from matpo_jax.rl.judge import JudgeConfig, LLMJudge
from matpo_jax.run.runtime import Runtime, optimizer_config, rng_for, rollout_config, step_config

log = logging.getLogger(__name__)
CONSUMED_FILE = "consumed.jsonl"


def rl_checkpointer(rt: Runtime) -> ckpt_lib.Checkpointer:
    cfg = rt.cfg
    return ckpt_lib.Checkpointer(rt.path("checkpoints", "rl"),
                                 save_every=int(cfg.train.checkpoint_every) or int(cfg.train.steps),
                                 keep=int(cfg.train.keep_checkpoints),
                                 async_save=bool(cfg.train.async_checkpointing))


def latest_rl_step(rt: Runtime) -> int | None:
    """The step a re-run will resume RL from (None: RL has not saved yet)."""
    with rl_checkpointer(rt) as checkpoints:
        return checkpoints.latest_step()


def reward_config(cfg) -> rewards_lib.RewardConfig:
    return rewards_lib.RewardConfig(mode=cfg.rollout.mode, accuracy=cfg.reward.method,
                                    f1_threshold=float(cfg.reward.f1_threshold))


def make_judge(cfg) -> LLMJudge | None:
    """The LLM judge client when the reward asks for one (an OpenAI-compatible endpoint)."""
    if cfg.reward.method != "judge":
        return None
    return LLMJudge(JudgeConfig(base_url=cfg.reward.judge_url, model=cfg.reward.judge_model,
                                api_key_env=cfg.reward.judge_api_key_env))


def model_state(state: step_lib.TrainState):
    """The full nnx state the sampler merges with the graphdef."""
    return nnx.merge_state(state.params, state.frozen)


def bucket_rows(needed: int, minimum: int, multiple: int) -> int:
    """Row count of a packed RL batch: powers of two above `minimum`, so a run compiles a few
    shapes, however much the rollouts' total length varies from step to step."""
    rows = max(minimum, multiple)
    while rows < needed:
        rows *= 2
    return packing.round_up(rows, multiple)


def rl_batch(rt: Runtime, rollouts, golds, questions, loss_cfg, row_multiple: int):
    """Rewards, advantages and the packed batch of one step's rollouts; plus their metrics."""
    cfg = rt.cfg
    breakdowns = rewards_lib.rollout_rewards(rollouts, golds, reward_config(cfg),
                                             questions=questions, judge=rt.judge)
    rewards = rewards_lib.rewards_by_id(breakdowns)
    advantages = adv_lib.assign_advantages(rollouts, rewards, group_by=cfg.rl.group_by,
                                           norm_by_std=bool(cfg.rl.norm_by_std))
    seqs = packing.sequences_from_rollouts(rollouts, advantages)
    max_len = int(cfg.rl.pack_len)
    trained = packing.trained_indices(seqs, loss_cfg)  # groups that all scored alike drop out
    needed = len(packing.first_fit_decreasing([len(seqs[i]) for i in trained], max_len))
    rows = bucket_rows(needed, int(cfg.rl.pack_rows), row_multiple)
    batch = packing.pack_sequences(seqs, max_len, row_multiple=row_multiple, rows=rows,
                                   loss_config=loss_cfg, drop_inert=True)
    metrics = rewards_lib.reward_metrics(breakdowns)
    metrics["trained_sequence_frac"] = len(trained) / max(len(seqs), 1)
    metrics["packing_efficiency"] = batch.efficiency()
    metrics["packed_rows"] = rows
    return batch, metrics


def rl_question_source(rt: Runtime):
    """The train split, less the questions SFT demonstrated when data.rl_skips_demonstrated."""
    cfg = rt.cfg
    train = loader_lib.open_source(rt.assets.config, rt.assets.data_dir)["train"]
    if not bool(cfg.data.rl_skips_demonstrated) or sft_lib.demonstration_split(cfg) != "train":
        return train
    demonstrated = set(sft_lib.demonstrated_indices(cfg, len(train)).tolist())
    rest = [i for i in range(len(train)) if i not in demonstrated]
    if len(rest) < int(cfg.data.batch_size):
        raise ValueError(
            f"data.rl_skips_demonstrated: sft.num_demos={int(cfg.sft.num_demos)} of "
            f"{len(train)} train questions leaves {len(rest)} for RL, fewer than "
            f"data.batch_size={int(cfg.data.batch_size)}; raise data.num_questions")
    log.info("RL questions: %d train questions SFT did not demonstrate", len(rest))
    return loader_lib.SubsetSource(train, rest)


def run_rl(rt: Runtime, graphdef, params, frozen, writer: metrics_lib.MetricsWriter,
           evaluate_fn=None):
    """Trains `cfg.train.steps` RL steps from `params` (or the newest RL checkpoint)."""
    cfg = rt.cfg
    steps, seed = int(cfg.train.steps), int(cfg.train.seed)
    tx = step_lib.make_optimizer(optimizer_config(cfg, "rl"))
    scfg = step_config(cfg, "rl")
    model = nnx.merge(graphdef, params, frozen)
    graphdef, state, shardings = step_lib.init_train_state(model, tx, rt.mesh, seed=seed)
    checkpoints = rl_checkpointer(rt)
    loader = loader_lib.make_loader("train", int(cfg.data.batch_size), int(cfg.data.shuffle_seed),
                                    source=rl_question_source(rt))
    questions_iter = iter(loader)
    start = 0
    restored = checkpoints.restore_latest(state.params, state.opt_state)
    if restored is not None:
        start = restored.step
        state = state.replace(params=restored.params, opt_state=restored.opt_state,
                              step=jax.numpy.asarray(start, jax.numpy.int32))
        questions_iter.set_state(restored.data_state)
        log.info("RL resumed at step %d", start)
    step_fn = step_lib.make_train_step(graphdef, tx, scfg, rt.mesh, shardings)
    rcfg = rollout_config(cfg)
    eval_every = int(cfg.train.eval_every)
    # Which questions each step trained on: a resumed run must consume the same stream.
    consumed = open(rt.path(CONSUMED_FILE), "a", encoding="utf-8")
    with consumed, metrics_lib.Progress(steps, initial=start, desc=f"rl[{cfg.rollout.mode}]",
                                        keys=("reward/mean", "reward/accuracy", "loss")) as bar:
        for step in range(start, steps):
            t0 = time.perf_counter()
            batch_q = next(questions_iter)
            rollout_batch = run_rollouts(model_state(state), graphdef, rt.chat, rt.toolbox,
                                         batch_q["question"], rcfg, rng_for(seed, 1, step))
            t1 = time.perf_counter()
            batch, metrics = rl_batch(rt, rollout_batch.rollouts, batch_q["answer"],
                                      batch_q["question"], scfg.loss, scfg.row_multiple(rt.mesh))
            state, step_metrics = step_fn(state, batch)
            metrics.update({k: float(np.asarray(v)) for k, v in step_metrics.items()})
            metrics.update(metrics_lib.rollout_stats(rollout_batch.rollouts))
            metrics.update({f"rollout/{k}": v for k, v in rollout_batch.metrics.items()
                            if np.isscalar(v)})
            metrics.update(time_rollout_s=t1 - t0, time_update_s=time.perf_counter() - t1)
            if eval_every and evaluate_fn is not None and (step + 1) % eval_every == 0 \
                    and step + 1 < steps:
                metrics.update(evaluate_fn(graphdef, model_state(state), tag=f"step{step + 1}"))
            writer.write(step + 1, metrics)
            consumed.write(json.dumps({"step": step + 1, "ids": list(batch_q["id"])}) + "\n")
            consumed.flush()
            bar.update(metrics)
            checkpoints.save(step + 1, params=state.params, opt_state=state.opt_state,
                             data_state=questions_iter.get_state(), force=step + 1 == steps)
    checkpoints.close()
    return state
