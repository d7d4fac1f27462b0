"""What `python -m matpo_jax.plan` compiles, from a typed experiment config: the model, the mesh,
the smallest packed batch an RL step sees, the RL step and optimizer, and the sampler's KV cache.
It goes through the translators the training run uses (run/runtime.py), so the plan compiles the
step that training would."""
from __future__ import annotations

import dataclasses

from matpo_jax.config import ExperimentConfig
from matpo_jax.planning.step_plan import PlanInputs
from matpo_jax.run import runtime


def plan_inputs(cfg: ExperimentConfig, *, rows: int | None = None, remat: str | None = None,
                scan_layers: bool = True, micro_batches: int | None = None,
                mfu: float = 0.4) -> PlanInputs:
    """rows / remat / micro_batches default to rl.pack_rows / train.remat / rl.micro_batches.
    scan_layers compiles the decoder layers as one scan (the same memory, far less compile time)."""
    if not isinstance(cfg, ExperimentConfig):
        raise TypeError(f"plan_inputs takes the typed config (config.to_typed), got "
                        f"{type(cfg).__name__}")
    step = dataclasses.replace(runtime.step_config(cfg, "rl"), remat=remat or cfg.train.remat,
                               scan_layers=scan_layers,
                               micro_batches=micro_batches or cfg.rl.micro_batches)
    return PlanInputs(model=runtime.model_config(cfg.model), mesh_shape=cfg.mesh.axes(),
                      rows=rows or cfg.rl.pack_rows, row_length=cfg.rl.pack_len, step=step,
                      optimizer=runtime.optimizer_config(cfg, "rl"),
                      decode_slots=cfg.rollout.decode_slots,
                      max_context=cfg.rollout.max_context,
                      max_turn=cfg.rollout.max_new_tokens_per_turn, mfu=mfu,
                      lora=runtime.lora_config(cfg.model), kv_cache=cfg.rollout.kv_cache,
                      kv_page_size=cfg.rollout.kv_page_size, kv_pages=cfg.rollout.kv_pages,
                      share_prompts=cfg.rl.share_prompts)
