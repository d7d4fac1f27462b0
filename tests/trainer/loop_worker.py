"""A tiny training phase through trainer.loop.TrainLoop: a Qwen3 of 32 hidden units trained on
MATPO batches built by rl.batch.matpo_batch from synthetic rollouts, one seed per step drawn from a
checkpointed data stream. Used in-process by the loop tests and as a process that the
fault-injection test kills (`python loop_worker.py WORKDIR STEPS`)."""
from __future__ import annotations

import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "fixtures"))

FINAL_PARAMS = "final_params.npz"


class SeedStream:
    """The data iterator: the seed of each step's rollouts; its position is checkpointed."""

    def __init__(self):
        self.position = 0

    def __next__(self) -> int:
        self.position += 1
        return 1000 + self.position

    def get_state(self) -> dict:
        return {"position": self.position}

    def set_state(self, state: dict) -> None:
        self.position = int(state["position"])


def build(workdir: str, steps: int, *, nan_steps=(), async_save: bool = True,
          max_nonfinite_steps: int = 3, learning_rate: float = 1e-2, step_sleep: float = 0.0):
    """(loop, batch_fn, data): a fresh process's view of the run in `workdir`."""
    import jax
    from flax import nnx

    from matpo_jax import parallel
    from matpo_jax.model import CausalLM
    from matpo_jax.rl import rewards
    from matpo_jax.rl.batch import matpo_batch
    from matpo_jax.trainer import loop as loop_lib
    from matpo_jax.trainer import step as step_lib
    from matpo_jax.trainer.loss import LossConfig
    from losses import default_loss
    from rl_batches import make_matpo_batch, tiny_model_config

    mesh = parallel.make_mesh(devices=jax.devices()[:1])
    model = CausalLM(tiny_model_config(), rngs=nnx.Rngs(0))
    config = loop_lib.LoopConfig(
        name="tiny", steps=steps, checkpoint_dir=os.path.join(workdir, "checkpoints"),
        checkpoint_every=1, keep_checkpoints=2, async_checkpointing=async_save,
        max_nonfinite_steps=max_nonfinite_steps, seed=3)
    optimizer = step_lib.OptimizerConfig(learning_rate=learning_rate, schedule="warmup_constant",
                                         warmup_steps=3)
    loss = default_loss(loss_agg="matpo")
    loop = loop_lib.TrainLoop(config, model, optimizer,
                              step_lib.TrainStepConfig(loss=loss, micro_batches=2), mesh)
    data = SeedStream()

    def batch_fn(step: int, state) -> loop_lib.StepBatch:
        seed = next(data)
        rollouts, golds = make_matpo_batch(seed=seed, queries=2, group=2, max_workers=1)
        scored = matpo_batch(rollouts,
                             rewards.rewards_by_id(rewards.rollout_rewards(rollouts, golds)),
                             loss_config=loss, pack_len=64, min_rows=8, row_multiple=2)
        batch = scored.batch
        if step in nan_steps:
            rows, cols = np.nonzero(batch.loss_mask)
            batch.old_logprobs[rows[0], cols[0]] = np.nan
        if step_sleep:
            time.sleep(step_sleep)  # a data pipeline's latency: room for a kill between saves
        return loop_lib.StepBatch(batch, {"data_seed": seed, **scored.metrics})

    return loop, batch_fn, data


def host_leaves(state) -> list[np.ndarray]:
    import jax
    return [np.asarray(x) for x in jax.tree.leaves(state.params)]


def run(workdir: str, steps: int, **kwargs):
    """Trains the phase in `workdir` to `steps` (resuming); returns the final TrainState."""
    from matpo_jax.report.metrics import MetricsWriter

    loop, batch_fn, data = build(workdir, steps, **kwargs)
    with MetricsWriter(workdir, tensorboard=False) as writer:
        state = loop.run(batch_fn, writer=writer, data=data)
    return state


if __name__ == "__main__":
    import logging
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("matpo_jax.trainer").setLevel(logging.INFO)  # "resumed at step N"
    workdir, total = sys.argv[1], int(sys.argv[2])
    final = run(workdir, total, step_sleep=float(os.environ.get("STEP_SLEEP", "0")))
    path = os.path.join(workdir, FINAL_PARAMS)
    np.savez(path + ".tmp.npz", *host_leaves(final))
    os.replace(path + ".tmp.npz", path)
