"""A finished demo run's first RL step, rebuilt for benchmarks: its config (with the run's SFT
checkpoint as the RL start), the runtime with the world's search service up, the SFT policy and
the step's questions. Used by benchmarks/injection_lanes.py and benchmarks/shared_prompts.py.

    with demo_run.first_step("runs/demo", "configs/synthetic_demo.py") as step:
        batch = step.rollouts()
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib

from matpo_jax import config as config_lib
from matpo_jax.agents.rollout import EngineOptions, run_rollouts
from matpo_jax.data.task_assets import prepare_task
from matpo_jax.run import runtime
from matpo_jax.run import sft as sft_phase
from matpo_jax.run.experiment import world_data_dir
from matpo_jax.run.rl import model_state, question_loader
from matpo_jax.tools.search_server import SearchServer
from matpo_jax.trainer import loop as loop_lib


@dataclasses.dataclass
class FirstStep:
    rt: runtime.Runtime
    loop: loop_lib.TrainLoop  # the RL loop, its train state holding the SFT parameters
    questions: dict  # the first batch of the RL question stream

    @property
    def cfg(self):
        return self.rt.cfg

    @property
    def graphdef(self):
        return self.loop.graphdef

    @property
    def state(self):
        """The SFT policy's full model state (the sampler's input)."""
        return model_state(self.loop.state)

    def rollouts(self, options: EngineOptions | None = None):
        """The step's rollouts (a RolloutBatch) under the run's sampling key for step 0."""
        cfg = self.cfg
        return run_rollouts(self.state, self.graphdef, self.rt.chat, self.rt.toolbox,
                            self.questions["question"], runtime.rollout_config(cfg),
                            runtime.rng_for(cfg.train.seed, 1, 0), options or EngineOptions(),
                            question_offset=0,
                            max_tool_calls_per_turn=runtime.tool_calls_per_turn(cfg),
                            prefix_rows=runtime.prefix_rows(cfg))


def sft_loop(cfg, mesh) -> loop_lib.TrainLoop:
    """The RL train loop, its state's parameters those of the checkpoint cfg.sft.init_checkpoint
    names."""
    loop = loop_lib.TrainLoop(runtime.loop_config(cfg, "rl", None), runtime.build_model(cfg, mesh),
                              runtime.optimizer_config(cfg, "rl"), runtime.step_config(cfg, "rl"),
                              mesh)
    loop.state = sft_phase.restore_shared_start(cfg, loop.state)
    return loop


@contextlib.contextmanager
def first_step(run: str, config_file: str, overrides: dict | None = None):
    c = config_lib.load_config_file(config_file)
    c = config_lib.apply_overrides(
        c, {"sft.init_checkpoint": os.path.join(run, "checkpoints", "sft"), **(overrides or {})})
    cfg = config_lib.to_typed(c)
    mesh = runtime.make_mesh(cfg)
    assets = prepare_task(cfg, world_data_dir(cfg.data, run))
    with SearchServer(assets.corpus_path) as server:
        rt = runtime.Runtime(cfg=cfg, workdir=run, mesh=mesh, assets=assets,
                             chat=runtime.run_chat(cfg, assets.chat),
                             toolbox=runtime.make_toolbox(cfg.tools, server.url), judge=None)
        yield FirstStep(rt, sft_loop(cfg, mesh), next(iter(question_loader(rt))))


def write_result(result: dict, out: str, lines: list[str]) -> None:
    """out.json (the result) and out.md (its lines), printed too."""
    pathlib.Path(out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(out + ".json").write_text(json.dumps(result, indent=1) + "\n")
    pathlib.Path(out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def machine_line(result: dict) -> str:
    return (f"{result['cpus']} CPUs, jax {result['jax']}, load average "
            f"{result['load_average']}.")
