"""One whole run: world -> search service -> model -> SFT -> eval -> RL -> eval -> plots.

Every phase resumes from its own checkpoints, so re-running the same command after a crash or a
preemption continues where the run stopped. The run's summary (the evaluations before and after RL)
is written to <workdir>/summary.json; curves to <workdir>/plots/.
"""
from __future__ import annotations

import json
import logging
import os

import jax

from matpo_jax import config as config_lib
from matpo_jax.report import metrics as metrics_lib
from matpo_jax.report import plots
from matpo_jax.report.files import write_json_atomic
from matpo_jax.tools.search_server import SearchServer
from matpo_jax.run.evaluation import evaluate
from matpo_jax.run.rl import latest_rl_step, make_judge, model_state, run_rl
from matpo_jax.run.runtime import Runtime, build_model, make_mesh, make_toolbox
from matpo_jax.run.sft import run_sft
from matpo_jax.data.world_assets import prepare_world

log = logging.getLogger(__name__)
SUMMARY_FILE = "summary.json"


def _cached_eval(rt: Runtime, tag: str, compute):
    """An evaluation already on disk is not run again (a resumed run keeps its SFT baseline);
    one that does not parse (torn by a crash before writes were atomic) is run again."""
    path = rt.path("eval", f"{tag}.json")
    if os.path.exists(path):
        try:
            with open(path) as f:
                return json.load(f)
        except json.JSONDecodeError:
            log.warning("%s does not parse; evaluating again", path)
    return compute()


def _write_summary(rt: Runtime, summary: dict) -> dict:
    if jax.process_index() == 0:
        write_json_atomic(rt.path(SUMMARY_FILE), summary, indent=1, sort_keys=True)
    return summary


def run_experiment(cfg, workdir: str) -> dict:
    os.makedirs(workdir, exist_ok=True)
    config_lib.save_config(cfg, workdir)
    mesh = make_mesh(cfg)
    data_dir = cfg.data.data_dir or os.path.join(workdir, "tfds")
    assets = prepare_world(cfg, data_dir)
    with SearchServer(assets.corpus_path) as server:
        rt = Runtime(cfg=cfg, workdir=workdir, mesh=mesh, assets=assets, chat=assets.chat,
                     toolbox=make_toolbox(cfg, server.url), judge=make_judge(cfg))
        primary = jax.process_index() == 0
        model = build_model(cfg, mesh)
        with metrics_lib.MetricsWriter(rt.path("sft"), enabled=primary) as sft_writer:
            graphdef, sft_state = run_sft(rt, model, sft_writer)
        if int(cfg.train.steps) == 0:  # an SFT-only run: a shared start for other runs
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
            writer.write(int(cfg.train.steps), final_eval)
    summary = {"sft_eval": sft_eval, "final_eval": final_eval, "workdir": os.path.abspath(workdir),
               "mode": cfg.rollout.mode}
    _write_summary(rt, summary)
    if primary:
        plots.plot_curves(rt.path(metrics_lib.METRICS_FILE), rt.path("plots"))
        if os.path.exists(rt.path("sft", metrics_lib.METRICS_FILE)):
            plots.plot_curves(rt.path("sft", metrics_lib.METRICS_FILE), rt.path("plots", "sft"))
    return summary
