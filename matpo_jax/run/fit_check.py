"""Before any work, `train` asks whether the config can fit the chips at all (planning/fit.py:
parameters, optimizer state and gradients of the train step; parameters, optimizer state and
the KV cache of rollout.decode_slots x rollout.max_context during rollouts), so a config that
cannot fit stops with one line naming the fields to change instead of an out-of-memory error
after the world, the model and SFT. Only TPU memory is planned; elsewhere the check runs only
with an explicit per-chip budget."""
from __future__ import annotations

import jax

from matpo_jax.config import ExperimentConfig
from matpo_jax.planning import fit
from matpo_jax.run.plan_inputs import plan_inputs
from matpo_jax.run.runtime import make_mesh


def check_config_fits(cfg: ExperimentConfig, hbm_per_chip: int | None = None,
                      mesh=None) -> fit.FitEstimate | None:
    """The per-chip estimate against `hbm_per_chip` bytes (default: the TPU's memory), or None
    when there is nothing to check against (not a TPU and no budget given). Raises ConfigError
    (one line per phase that cannot fit) otherwise."""
    hbm = hbm_per_chip or fit.device_hbm_bytes(jax.local_devices()[0])
    if hbm is None:
        return None
    return fit.check_fits(plan_inputs(cfg), mesh if mesh is not None else make_mesh(cfg), hbm)
