"""What every phase of a run shares: config, mesh, the world on disk, tools, model definition.

Built once by `experiment.run_experiment`; the phases (SFT, RL, evaluation) are functions of it.
"""
from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np
from flax import nnx

from matpo_jax import parallel
from matpo_jax.agents import rollout as rollout_lib
from matpo_jax.tools import clients as tools_lib
from matpo_jax.config import resolve_mesh_shape
from matpo_jax.model import Qwen3Config, Qwen3ForCausalLM, load_pretrained
from matpo_jax.trainer import loss as loss_lib
from matpo_jax.trainer import step as step_lib
from matpo_jax.chat import ChatFormat
from matpo_jax.data.world_assets import WorldAssets


@dataclasses.dataclass
class Runtime:
    cfg: object  # ml_collections.ConfigDict, validated
    workdir: str
    mesh: jax.sharding.Mesh
    assets: WorldAssets
    chat: ChatFormat
    toolbox: tools_lib.ToolBox  # search + open for workers and the single agent
    judge: object = None  # rl.judge.LLMJudge when reward.method == "judge"

    def path(self, *parts: str) -> str:
        return os.path.join(self.workdir, *parts)


def make_mesh(cfg) -> jax.sharding.Mesh:
    return parallel.make_mesh(resolve_mesh_shape(dict(cfg.mesh), jax.device_count()))


def make_toolbox(cfg, search_url: str) -> tools_lib.ToolBox:
    """Worker tools from config: our local server (Serper protocol) or a remote service."""
    policy = tools_lib.HttpPolicy(read_timeout_s=float(cfg.tools.timeout_s),
                                  max_retries=int(cfg.tools.retries),
                                  max_chars=int(cfg.tools.max_response_chars))
    protocol = "retrieval" if cfg.tools.search_backend == "retrieval" else "serper"
    return tools_lib.worker_toolbox(cfg.tools.search_url or search_url, protocol=protocol,
                                    page_url=cfg.tools.page_url or search_url, policy=policy)


def build_model(cfg, mesh) -> Qwen3ForCausalLM:
    """A fresh tiny model from `model.arch`, or Hugging Face weights from `model.hf_checkpoint`."""
    if cfg.model.hf_checkpoint:
        return load_pretrained(cfg.model.hf_checkpoint, dtype=cfg.model.dtype, mesh=mesh,
                               param_dtype=cfg.model.param_dtype)
    arch = dict(cfg.model.arch)
    config = Qwen3Config(**arch, dtype=cfg.model.dtype, param_dtype=cfg.model.param_dtype)
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(int(cfg.train.seed)))
    return parallel.shard_model(model, mesh)


def loss_config(cfg) -> loss_lib.LossConfig:
    rl = cfg.rl
    return loss_lib.LossConfig(
        aggregation=rl.loss_agg, seq_denominator=rl.seq_mean_denominator,
        norm_constant=float(rl.loss_agg_norm) or None, eps_low=float(rl.eps_low),
        eps_high=float(rl.eps_high), dual_clip=float(rl.dual_clip_c), kl_coef=float(rl.kl_coef),
        kl_type=rl.kl_type, entropy_coef=float(rl.entropy_coef))


def optimizer_config(cfg, phase: str) -> step_lib.OptimizerConfig:
    rl = cfg.rl
    if phase == "sft":
        return step_lib.OptimizerConfig(learning_rate=float(cfg.sft.lr), schedule="warmup_cosine",
                                        warmup_steps=min(20, int(cfg.sft.steps) // 10),
                                        decay_steps=int(cfg.sft.steps), end_lr_ratio=0.1,
                                        weight_decay=float(rl.weight_decay),
                                        grad_clip=float(rl.grad_clip))
    return step_lib.OptimizerConfig(learning_rate=float(rl.lr), schedule=rl.schedule,
                                    warmup_steps=int(rl.warmup_steps),
                                    weight_decay=float(rl.weight_decay), b1=float(rl.adam_b1),
                                    b2=float(rl.adam_b2), grad_clip=float(rl.grad_clip))


def step_config(cfg, phase: str) -> step_lib.TrainStepConfig:
    if phase == "sft":
        return step_lib.TrainStepConfig(objective="sft", loss=loss_config(cfg))
    return step_lib.TrainStepConfig(objective="rl", loss=loss_config(cfg),
                                    micro_batches=int(cfg.rl.micro_batches),
                                    ppo_mini_batches=int(cfg.rl.ppo_mini_batches),
                                    ppo_epochs=int(cfg.rl.ppo_epochs))


def rollout_config(cfg, *, evaluation: bool = False) -> rollout_lib.RolloutConfig:
    r = cfg.rollout
    temperature = float(cfg.eval.temperature) if evaluation else float(r.temperature)
    return rollout_lib.RolloutConfig(
        mode=r.mode, group_size=1 if evaluation else int(r.group_size),
        max_turns_planner=int(r.max_turns_planner), max_turns_worker=int(r.max_turns_worker),
        max_context=int(r.max_context), max_new_tokens=int(r.max_new_tokens_per_turn),
        max_worker_calls_per_turn=int(r.max_worker_calls_per_turn),
        report_max_chars=int(r.report_max_chars),
        tool_response_max_chars=int(cfg.tools.max_response_chars),
        final_summary=bool(r.final_summary),
        final_summary_max_tokens=min(int(r.final_summary_max_tokens),
                                     int(r.max_new_tokens_per_turn)),
        user_query_recap=bool(r.user_query_recap),
        malformed_tool_call=r.malformed_tool_call, slots=int(r.decode_slots),
        temperature=temperature, top_p=float(r.top_p), top_k=int(r.top_k),
        reuse_prefixes=bool(r.reuse_prefixes), async_tools=bool(r.async_tools))


def rng_for(seed: int, *path: int) -> jax.Array:
    """A key that depends only on (seed, path): the same step always samples the same way."""
    key = jax.random.key(seed)
    for p in path:
        key = jax.random.fold_in(key, p)
    return key


def numpy_rng(seed: int, *path: int) -> np.random.Generator:
    return np.random.default_rng([seed, *path])
