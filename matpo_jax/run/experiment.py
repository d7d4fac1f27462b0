"""One whole run: world -> search service -> model -> SFT -> eval -> RL -> eval -> plots.

Every phase resumes from its own checkpoints, so re-running the same command after a crash or a
preemption continues where the run stopped; the workdir's config.json is compared with the new
config first, and a changed config is refused (config/resume.py). The run's summary (the
evaluations before and after RL) is written to <workdir>/summary.json; curves to <workdir>/plots/.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Iterable

import jax

from matpo_jax import config as config_lib
from matpo_jax.config import DataSection, ExperimentConfig
from matpo_jax.data.world_assets import prepare_world
from matpo_jax.parallel import multihost
from matpo_jax.report import metrics as metrics_lib
from matpo_jax.report import plots
from matpo_jax.report.files import write_json_atomic
from matpo_jax.run.evaluation import evaluate
from matpo_jax.run.rl import latest_rl_step, model_state, run_rl
from matpo_jax.run.runtime import Runtime, build_model, make_judge, make_mesh, make_toolbox
from matpo_jax.run.sft import run_sft
from matpo_jax.tools.search_server import SearchServer

log = logging.getLogger(__name__)
SUMMARY_FILE = "summary.json"


def world_data_dir(data: DataSection, workdir: str) -> str:
    """Where the world's dataset, corpus and tokenizer live: data.data_dir, or <workdir>/tfds."""
    return data.data_dir or os.path.join(workdir, "tfds")


def _cached_eval(rt: Runtime, tag: str, compute):
    """An evaluation already on disk is not run again (a resumed run keeps its SFT baseline);
    one that does not parse (torn by a crash before writes were atomic) is run again.
    Several processes follow process 0's file (evaluating is collective)."""
    path = rt.path("eval", f"{tag}.json")
    cached = None
    if multihost.is_primary() and os.path.exists(path):
        try:
            with open(path) as f:
                cached = json.load(f)
        except ValueError:  # JSONDecodeError, or undecodable bytes
            log.warning("%s does not parse; evaluating again", path)
    cached = multihost.broadcast_object(cached)
    return compute() if cached is None else cached


def _write_summary(rt: Runtime, summary: dict) -> dict:
    if jax.process_index() == 0:
        write_json_atomic(rt.path(SUMMARY_FILE), summary, indent=1, sort_keys=True)
    return summary


def run_experiment(cfg: ExperimentConfig, workdir: str, *,
                   allow_config_change: str | Iterable[str] = ()) -> dict:
    """Runs (or resumes) the experiment `cfg` (config.to_typed) in `workdir`.

    allow_config_change: fields of config/resume.RESUME_SAFE_FIELDS a resumed run may change."""
    if not isinstance(cfg, ExperimentConfig):
        raise TypeError(f"run_experiment takes the typed config (config.to_typed), got "
                        f"{type(cfg).__name__}")
    os.makedirs(workdir, exist_ok=True)
    config_lib.check_resume(cfg, workdir, allow_config_change)  # before anything is written
    if cfg.data.batch_size % jax.process_count():
        raise config_lib.ConfigError(
            f"data.batch_size={cfg.data.batch_size} does not divide by the {jax.process_count()} "
            "processes (each process rolls out an equal share of every batch)")
    if jax.process_index() == 0:
        config_lib.save_config(cfg, workdir)
    mesh = make_mesh(cfg)
    # Process 0 builds the world first: processes sharing a data_dir must not write it at once.
    if not multihost.is_primary():
        multihost.barrier("world_prepared")
    assets = prepare_world(cfg, world_data_dir(cfg.data, workdir))
    if multihost.is_primary():
        multihost.barrier("world_prepared")
    with SearchServer(assets.corpus_path) as server:
        rt = Runtime(cfg=cfg, workdir=workdir, mesh=mesh, assets=assets, chat=assets.chat,
                     toolbox=make_toolbox(cfg.tools, server.url), judge=make_judge(cfg.reward))
        primary = jax.process_index() == 0
        model = build_model(cfg, mesh)
        with metrics_lib.MetricsWriter(rt.path("sft"), enabled=primary) as sft_writer:
            graphdef, sft_state = run_sft(rt, model, sft_writer)
        if cfg.train.steps == 0:  # an SFT-only run: a shared start for other runs
            log.info("train.steps = 0: SFT only, checkpoints in %s", rt.path("checkpoints", "sft"))
            return _write_summary(rt, {"workdir": os.path.abspath(workdir), "sft_only": True})
        eval_fn = lambda g, s, tag: evaluate(rt, g, s, tag=tag)  # noqa: E731
        sft_eval = _cached_eval(rt, "sft", lambda: eval_fn(graphdef, model_state(sft_state), "sft"))
        resume_step = latest_rl_step(rt)
        with metrics_lib.MetricsWriter(workdir, enabled=primary, resume_step=resume_step) as writer:
            writer.write(0, sft_eval)
            state = run_rl(rt, graphdef, sft_state.params, sft_state.frozen, writer, eval_fn)
            final_eval = _cached_eval(rt, "final",
                                      lambda: eval_fn(graphdef, model_state(state), "final"))
            writer.write(cfg.train.steps, final_eval)
    summary = {"sft_eval": sft_eval, "final_eval": final_eval, "workdir": os.path.abspath(workdir),
               "mode": cfg.rollout.mode}
    _write_summary(rt, summary)
    if primary:
        plots.plot_curves(rt.path(metrics_lib.METRICS_FILE), rt.path("plots"))
        if os.path.exists(rt.path("sft", metrics_lib.METRICS_FILE)):
            plots.plot_curves(rt.path("sft", metrics_lib.METRICS_FILE), rt.path("plots", "sft"))
    return summary
