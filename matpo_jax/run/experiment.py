"""One whole run: world -> search service -> model -> SFT -> eval -> RL -> eval -> plots.

Every phase resumes from its own checkpoints, so re-running the same command after a crash or a
preemption continues where the run stopped; the workdir's config.json is compared with the new
config first, and a changed config is refused (config/resume.py). The run's summary (the
evaluations before and after RL) is written to <workdir>/summary.json; curves to <workdir>/plots/.
"""
from __future__ import annotations

import json
import logging
from typing import Iterable

import jax

from matpo_jax import config as config_lib
from matpo_jax.config import DataSection, ExperimentConfig
from matpo_jax.data.world_assets import prepare_world
from matpo_jax.report import metrics as metrics_lib
from matpo_jax.report import plots
from matpo_jax.report import files
from matpo_jax.report.files import write_json_atomic
from matpo_jax.run.evaluation import evaluate
from matpo_jax.run.rl import latest_rl_step, model_state, run_rl
from matpo_jax.run.runtime import Runtime, build_model, make_judge, make_mesh, make_toolbox
from matpo_jax.run.sft import run_sft
from matpo_jax.tools.search_server import SearchServer

log = logging.getLogger(__name__)
SUMMARY_FILE = "summary.json"


def world_data_dir(data: DataSection, workdir: str) -> str:
    """Where the world's dataset, corpus and tokenizer live: data.data_dir, or <workdir>/tfds
    (a local folder standing in for it when the workdir is on an object store)."""
    return data.data_dir or files.local_dir_for(workdir, "tfds")


def _cached_eval(rt: Runtime, tag: str, compute):
    """An evaluation already on disk is not run again (a resumed run keeps its SFT baseline);
    one that does not parse (torn by a crash before writes were atomic) is run again."""
    path = rt.path("eval", f"{tag}.json")
    if files.run_path(path).exists():
        try:
            return json.loads(files.run_path(path).read_text(encoding="utf-8"))
        except ValueError:  # JSONDecodeError, or undecodable bytes
            log.warning("%s does not parse; evaluating again", path)
    return compute()


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
    files.makedirs(workdir)
    config_lib.check_resume(cfg, workdir, allow_config_change)  # before anything is written
    if jax.process_index() == 0:
        config_lib.save_config(cfg, workdir)
    mesh = make_mesh(cfg)
    assets = prepare_world(cfg, world_data_dir(cfg.data, workdir))
    with SearchServer(assets.corpus_path) as server:
        rt = Runtime(cfg=cfg, workdir=workdir, mesh=mesh, assets=assets, chat=assets.chat,
                     toolbox=make_toolbox(cfg.tools, server.url), judge=make_judge(cfg.reward))
        primary = jax.process_index() == 0
        model = build_model(cfg, mesh)
        with metrics_lib.MetricsWriter(rt.path("sft"), enabled=primary) as sft_writer:
            graphdef, sft_state = run_sft(rt, model, sft_writer)
        if cfg.train.steps == 0:  # an SFT-only run: a shared start for other runs
            log.info("train.steps = 0: SFT only, checkpoints in %s", rt.path("checkpoints", "sft"))
            return _write_summary(rt, {"workdir": files.absolute(workdir), "sft_only": True})
        eval_fn = lambda g, s, tag: evaluate(rt, g, s, tag=tag)  # noqa: E731
        sft_eval = _cached_eval(rt, "sft", lambda: eval_fn(graphdef, model_state(sft_state), "sft"))
        resume_step = latest_rl_step(rt)
        with metrics_lib.MetricsWriter(workdir, enabled=primary, resume_step=resume_step) as writer:
            writer.write(0, sft_eval)
            state = run_rl(rt, graphdef, sft_state.params, sft_state.frozen, writer, eval_fn)
            final_eval = _cached_eval(rt, "final",
                                      lambda: eval_fn(graphdef, model_state(state), "final"))
            writer.write(cfg.train.steps, final_eval)
    summary = {"sft_eval": sft_eval, "final_eval": final_eval, "workdir": files.absolute(workdir),
               "mode": cfg.rollout.mode}
    _write_summary(rt, summary)
    if primary:
        plots.plot_curves(rt.path(metrics_lib.METRICS_FILE), rt.path("plots"))
        if files.run_path(rt.path("sft", metrics_lib.METRICS_FILE)).exists():
            plots.plot_curves(rt.path("sft", metrics_lib.METRICS_FILE), rt.path("plots", "sft"))
    return summary
