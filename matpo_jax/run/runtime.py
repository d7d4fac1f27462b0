"""What every phase of a run shares (config, mesh, the world on disk, tools, model definition), and
the translators from the typed config to the stages' own settings, each in one place.

Built once by `experiment.run_experiment`; the phases (SFT, RL, evaluation) are functions of it.
The rollout engine consumes `cfg.rollout` itself; the optimizer, train step, loss, reward, judge
and tool clients have settings of their own, built here from their sections.
"""
from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np
from flax import nnx

from matpo_jax import parallel
from matpo_jax.chat import ChatFormat
from matpo_jax.config import (ExperimentConfig, MeshSection, ModelSection, RewardSection,
                              RLSection, RolloutSection, ToolsSection)
from matpo_jax.data.task_assets import TaskAssets
from matpo_jax.model import DecoderConfig, CausalLM, load_pretrained
from matpo_jax.model.config import ATTENTION_KERNELS
from matpo_jax.model import lora as lora_lib
from matpo_jax.parallel.mesh import resolve_mesh_shape
from matpo_jax.rl import rewards as rewards_lib
from matpo_jax.rl.judge import JudgeConfig, LLMJudge
from matpo_jax.run import provenance
from matpo_jax.tools import clients as tools_lib
from matpo_jax.trainer import loop as loop_lib
from matpo_jax.trainer import loss as loss_lib
from matpo_jax.trainer import step as step_lib


@dataclasses.dataclass
class Runtime:
    cfg: ExperimentConfig  # validated (config.to_typed)
    workdir: str
    mesh: jax.sharding.Mesh
    assets: TaskAssets  # the dataset, corpus and tokenizer of data.name
    chat: ChatFormat
    toolbox: tools_lib.ToolBox  # search + open for workers and the single agent
    judge: LLMJudge | None = None  # when reward.method == "judge"

    def path(self, *parts: str) -> str:
        return os.path.join(self.workdir, *parts)


# ------------------------------------------------------------------------------- mesh and model
def mesh_shape(mesh: MeshSection, num_devices: int) -> dict[str, int]:
    return resolve_mesh_shape(mesh.axes(), num_devices)


def make_mesh(cfg: ExperimentConfig) -> jax.sharding.Mesh:
    return parallel.make_mesh(mesh_shape(cfg.mesh, jax.device_count()))


def attention_kernels(model: ModelSection) -> dict[str, str]:
    """`model.attention` as the decoder's fields (attention_train, _extend, _decode)."""
    return {f"attention_{path}": getattr(model.attention, path) for path in ATTENTION_KERNELS}


def model_config(model: ModelSection) -> DecoderConfig:
    """The architecture of a model trained from scratch (`model.arch`, dtypes, attention)."""
    return DecoderConfig(**dataclasses.asdict(model.arch), dtype=model.dtype,
                       param_dtype=model.param_dtype, **attention_kernels(model))


def lora_config(model: ModelSection) -> lora_lib.LoRAConfig | None:
    """The adapters of `model.lora`, or None (rank 0: full fine-tuning)."""
    lora = model.lora
    if not lora.rank:
        return None
    return lora_lib.LoRAConfig(rank=lora.rank, alpha=lora.alpha, targets=tuple(lora.targets),
                               roles=lora.roles, base_dtype=lora.base_dtype)


def build_model(cfg: ExperimentConfig, mesh) -> CausalLM:
    """A fresh model from `model.arch`, or Hugging Face weights from `model.hf_checkpoint`;
    with `model.lora.rank` > 0, fresh adapters over it (train.seed), which the train state then
    trains alone."""
    lora = lora_config(cfg.model)
    if cfg.model.hf_checkpoint:
        model = load_pretrained(cfg.model.hf_checkpoint, dtype=cfg.model.dtype, mesh=mesh,
                                param_dtype=cfg.model.param_dtype,
                                attention=attention_kernels(cfg.model))
        if lora is None:
            return model  # already on its shardings
    else:
        model = CausalLM(model_config(cfg.model), rngs=nnx.Rngs(cfg.train.seed))
    if lora is not None:
        lora_lib.add_adapters(model, lora, seed=cfg.train.seed)
    return parallel.shard_model(model, mesh)


# ----------------------------------------------------------------------------------------- tools
class CappedTool:
    """A tool client whose text is cut at the context's cap (`tools.max_response_chars`): what
    rollouts and SFT demonstrations both put in the context."""

    def __init__(self, client, max_chars: int):
        self.client, self.max_chars = client, max_chars

    def __call__(self, **arguments) -> tools_lib.ToolResult:
        result = self.client(**arguments)
        return dataclasses.replace(result, text=result.text[:self.max_chars])


def make_toolbox(tools: ToolsSection, local_url: str) -> tools_lib.ToolBox:
    """Worker tools from the tools section: our local server (Serper protocol, at `local_url`)
    or a remote service."""
    policy = tools_lib.HttpPolicy(read_timeout_s=tools.timeout_s, deadline_s=tools.deadline_s,
                                  max_retries=tools.retries, max_chars=tools.max_response_chars)
    search_url = tools.search_url or local_url
    protocol = "retrieval" if tools.search_backend == "retrieval" else "serper"  # local: serper
    box = tools_lib.worker_toolbox(
        search_url, protocol=protocol, page_url=tools.page_url or local_url, policy=policy,
        page_backend=tools.page_backend, reader_url=tools.reader_url,
        api_key_env=tools.api_key_env, reader_key_env=tools.reader_key_env,
        num_results=tools.num_results, cache_dir=tools.cache_dir,
        allowed_urls=[url for url in (local_url,) if url])
    capped = {name: CappedTool(client, tools.max_response_chars)
              for name, client in box.clients.items()}
    return tools_lib.ToolBox(capped, box.schemas, box.metrics)


# ------------------------------------------------------------------------------ optimizer, loss
def loss_config(rl: RLSection) -> loss_lib.LossConfig:
    """The loss's knobs are the rl fields of the same names (its internal fields keep theirs)."""
    knobs = {f.name for f in dataclasses.fields(rl)}
    return loss_lib.LossConfig(**{f.name: getattr(rl, f.name)
                                  for f in dataclasses.fields(loss_lib.LossConfig)
                                  if f.name in knobs})


# rl.schedule -> the optimizer's schedule (each with rl.warmup_steps of linear warmup first).
_RL_SCHEDULES = {"constant": "warmup_constant", "cosine": "warmup_cosine",
                 "linear": "warmup_linear"}


def optimizer_config(cfg: ExperimentConfig, phase: str) -> step_lib.OptimizerConfig:
    rl = cfg.rl
    if phase == "sft":
        steps = cfg.sft.steps
        return step_lib.OptimizerConfig(learning_rate=cfg.sft.lr, schedule="warmup_cosine",
                                        warmup_steps=min(20, steps // 10),
                                        decay_steps=max(1, steps), end_lr_ratio=0.1,
                                        weight_decay=rl.weight_decay, grad_clip=rl.grad_clip)
    # The schedule counts optimizer updates: ppo_mini_batches x ppo_epochs per RL step.
    updates = cfg.train.steps * rl.ppo_mini_batches * rl.ppo_epochs
    schedule = ("constant" if rl.schedule == "constant" and rl.warmup_steps == 0
                else _RL_SCHEDULES[rl.schedule])
    return step_lib.OptimizerConfig(optimizer=rl.optimizer, learning_rate=rl.lr, schedule=schedule,
                                    warmup_steps=rl.warmup_steps,
                                    decay_steps=max(1, updates - rl.warmup_steps),
                                    end_lr_ratio=0.0, weight_decay=rl.weight_decay,
                                    adam_b1=rl.adam_b1, adam_b2=rl.adam_b2,
                                    grad_clip=rl.grad_clip)


def step_config(cfg: ExperimentConfig, phase: str) -> step_lib.TrainStepConfig:
    if phase == "sft":
        return step_lib.TrainStepConfig(objective="sft", loss=loss_config(cfg.rl),
                                        remat=cfg.train.remat)
    # Log-probs at the rollouts' sampling temperature (greedy rollouts: the plain softmax), the
    # workers' at theirs when rollout.worker_temperature is set.
    worker = cfg.rollout.worker_temperature
    return step_lib.TrainStepConfig(objective="rl", loss=loss_config(cfg.rl),
                                    temperature=cfg.rollout.temperature or 1.0,
                                    worker_temperature=None if worker is None else worker or 1.0,
                                    remat=cfg.train.remat,
                                    micro_batches=cfg.rl.micro_batches,
                                    ppo_mini_batches=cfg.rl.ppo_mini_batches,
                                    ppo_epochs=cfg.rl.ppo_epochs,
                                    role_grad_norms=cfg.rl.role_grad_norms)


def loop_config(cfg: ExperimentConfig, phase: str, checkpoint_dir: str | None,
                chat: ChatFormat | None = None) -> loop_lib.LoopConfig:
    """The training loop of a phase ("copy", "sft" or "rl"); checkpoints in `checkpoint_dir`,
    each recording the run's config and `chat`'s tokenizer (run/provenance.py)."""
    train = cfg.train
    identity = {} if chat is None else {
        provenance.IDENTITY_KEY: provenance.checkpoint_identity(cfg, chat)}
    base = identity.get(provenance.IDENTITY_KEY, {}).get(provenance.BASE_KEY)
    restore_check = None if base is None else (
        lambda meta: provenance.check_base(meta.get(provenance.IDENTITY_KEY), base,
                                           checkpoint=str(checkpoint_dir)))
    shared = dict(checkpoint_dir=checkpoint_dir, checkpoint_metadata=identity,
                  restore_check=restore_check,
                  checkpoint_every=train.checkpoint_every,
                  keep_checkpoints=train.keep_checkpoints,
                  async_checkpointing=train.async_checkpointing, log_every=train.log_every,
                  max_nonfinite_steps=train.max_nonfinite_steps, seed=train.seed)
    if phase == "copy":
        return loop_lib.LoopConfig(name="copy", steps=cfg.sft.copy_steps, metric_prefix="copy/",
                                   progress_keys=("copy/loss",), **shared)
    if phase == "sft":
        return loop_lib.LoopConfig(name="sft", steps=cfg.sft.steps, metric_prefix="sft/",
                                   progress_keys=("sft/loss",), **shared)
    return loop_lib.LoopConfig(name=f"rl[{cfg.rollout.mode}]", steps=train.steps,
                               progress_keys=("reward/mean", "reward/accuracy", "loss"), **shared)


# ------------------------------------------------------------------------- rollouts and rewards
def rollout_config(cfg: ExperimentConfig, *, evaluation: bool = False) -> RolloutSection:
    """What the rollout engine runs: the rollout section; evaluation samples each question once
    at `eval.temperature`."""
    if evaluation:
        # Workers too sample at eval.temperature (their own training temperature is not used).
        return dataclasses.replace(cfg.rollout, group_size=1, temperature=cfg.eval.temperature,
                                   worker_temperature=None)
    return cfg.rollout


def prefix_rows(cfg: ExperimentConfig) -> int:
    """The prefixes one training batch registers per process (run_rollouts' prefix_rows): each
    role's system turn, and each question's prompt when its G samples share it. Evaluations pass
    it too, so that they run the sampler loop the rollouts compiled (a loop with host callbacks
    is compiled again by every process: JAX's persistent cache does not keep it)."""
    rollout = cfg.rollout
    if not rollout.reuse_prefixes:
        return 0
    roles = 2 if rollout.mode == "matpo" else 1
    questions = -(-cfg.data.batch_size // jax.process_count())
    return roles + (questions if rollout.group_size > 1 else 0)


def tool_calls_per_turn(cfg: ExperimentConfig) -> int:
    """run_rollouts' max_tool_calls_per_turn: the search/open calls one turn may make (they run
    at once; the rest are answered by an error text)."""
    return cfg.tools.max_calls_per_turn


def run_chat(cfg: ExperimentConfig, chat: ChatFormat) -> ChatFormat:
    """The chat format a run speaks: its tokenizer's, in `chat.enable_thinking`'s mode."""
    return chat.with_thinking(cfg.chat.enable_thinking)


def reward_config(cfg: ExperimentConfig) -> rewards_lib.RewardConfig:
    return rewards_lib.RewardConfig(mode=cfg.rollout.mode, method=cfg.reward.method,
                                    f1_threshold=cfg.reward.f1_threshold,
                                    format_credit=cfg.reward.format_credit)


def judge_config(reward: RewardSection, url: str | None = None) -> JudgeConfig:
    """The judge client's settings from the reward section (`url`: another endpoint)."""
    return JudgeConfig(base_url=url or reward.judge_url, model=reward.judge_model,
                       api_key_env=reward.judge_api_key_env, timeout_s=reward.judge_timeout_s,
                       max_retries=reward.judge_max_retries)


def make_judge(reward: RewardSection) -> LLMJudge | None:
    """The LLM judge client when the reward asks for one (an OpenAI-compatible endpoint)."""
    if reward.method != "judge":
        return None
    return LLMJudge(judge_config(reward))


# ------------------------------------------------------------------------------------------ rngs
def rng_for(seed: int, *path: int) -> jax.Array:
    """A key that depends only on (seed, path): the same step always samples the same way."""
    key = jax.random.key(seed)
    for p in path:
        key = jax.random.fold_in(key, p)
    return key


def numpy_rng(seed: int, *path: int) -> np.random.Generator:
    return np.random.default_rng([seed, *path])
