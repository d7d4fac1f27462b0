"""One whole run: task -> search service -> model -> SFT -> eval -> RL -> eval -> plots.

The task (data/task_assets.py) is the synthetic world, or a published dataset (data.name =
musique: its train split, its paragraph corpus, the checkpoint's tokenizer); evaluation covers
eval.datasets (run/eval/registry.py).

Every phase resumes from its own checkpoints, so re-running the same command after a crash or a
preemption continues where the run stopped; the workdir's config.json is compared with the new
config first, and a changed config is refused (config/resume.py). The run's summary (the
evaluations before and after RL) is written to <workdir>/summary.json; figures to <workdir>/plots/
(report/plots.py).
"""
from __future__ import annotations

import contextlib
import json
import logging
from typing import Iterable

import jax

from matpo_jax import config as config_lib
from matpo_jax.config import DataSection, ExperimentConfig
from matpo_jax.data.task_assets import prepare_task
from matpo_jax.parallel import multihost
from matpo_jax.report import metrics as metrics_lib
from matpo_jax.report import plots
from matpo_jax.report import files
from matpo_jax.report.files import write_json_atomic
from matpo_jax.run import startup_checks
from matpo_jax.run.eval import curve as eval_curve
from matpo_jax.run.eval.registry import evaluate_run
from matpo_jax.run.rl import latest_rl_step, model_state, run_rl
from matpo_jax.run.runtime import (Runtime, build_model, make_judge, make_mesh, make_toolbox,
                                   run_chat)
from matpo_jax.run.sft import run_sft
from matpo_jax.run.workdir_lock import workdir_lock
from matpo_jax.tools.search_server import SearchServer

log = logging.getLogger(__name__)
SUMMARY_FILE = "summary.json"


def world_data_dir(data: DataSection, workdir: str) -> str:
    """Where the run's dataset, corpus (and a trained tokenizer) live: data.data_dir, or
    <workdir>/tfds (a local folder standing in for it when the workdir is on an object store)."""
    return data.data_dir or files.local_dir_for(workdir, "tfds")


def uses_local_service(cfg: ExperimentConfig, assets) -> bool:
    """Whether the tools read the local search service (over the task's corpus): `search` with
    tools.search_backend = local, or `open` from the page service without a page_url."""
    if not assets.corpus_path:
        return False
    tools = cfg.tools
    return tools.search_backend == "local" or (tools.page_backend == "service"
                                               and not tools.page_url)


def _cached_eval(rt: Runtime, tag: str, compute, *, valid=lambda: True):
    """An evaluation already on disk is not run again (a resumed run keeps its SFT baseline);
    one that does not parse (torn by a crash before writes were atomic), or that `valid()` says
    belongs to other parameters, is run again. Several processes follow process 0's file
    (evaluating is collective)."""
    path = rt.path("eval", f"{tag}.json")
    cached = None
    if multihost.is_primary() and files.run_path(path).exists() and valid():
        try:
            cached = json.loads(files.run_path(path).read_text(encoding="utf-8"))
        except ValueError:  # JSONDecodeError, or undecodable bytes
            log.warning("%s does not parse; evaluating again", path)
    cached = multihost.broadcast_object(cached)
    return compute() if cached is None else cached


def _finished_at(rt: Runtime) -> int | None:
    """The RL steps of the run the workdir's summary records as finished (None: no summary, or
    one from before summaries recorded them)."""
    path = files.run_path(rt.path(SUMMARY_FILE))
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("rl_steps")
    except (FileNotFoundError, ValueError, AttributeError):
        return None


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
    # One run per workdir, taken before the run writes (process 0 holds it for all).
    with workdir_lock(workdir) if jax.process_index() == 0 else contextlib.nullcontext():
        return _run_experiment(cfg, workdir)


def _run_experiment(cfg: ExperimentConfig, workdir: str) -> dict:
    if cfg.data.batch_size % jax.process_count():
        raise config_lib.ConfigError(
            f"data.batch_size={cfg.data.batch_size} does not divide by the {jax.process_count()} "
            "processes (each process rolls out an equal share of every batch)")
    mesh = make_mesh(cfg)
    startup_checks.check_batches_fit_host(cfg, mesh.shape["data"] * mesh.shape["fsdp"])
    # Process 0 prepares the task first: processes sharing a data_dir must not write it at once.
    if not multihost.is_primary():
        multihost.barrier("world_prepared")
    assets = prepare_task(cfg, world_data_dir(cfg.data, workdir))
    if multihost.is_primary():
        multihost.barrier("world_prepared")
    startup_checks.check_prompts_fit(cfg, assets)  # needs the task's tokenizer and questions
    # The run has started: from here on its record makes a rerun a resume of this config. Written
    # after the checks above, so a run they refuse can be rerun with the fix.
    if jax.process_index() == 0:
        config_lib.save_config(cfg, workdir)
    with contextlib.ExitStack() as services:
        server = (services.enter_context(SearchServer(assets.corpus_path))
                  if uses_local_service(cfg, assets) else None)
        if server is not None:
            log.info("local search service over %s", assets.corpus_path)
        rt = Runtime(cfg=cfg, workdir=workdir, mesh=mesh, assets=assets,
                     chat=run_chat(cfg, assets.chat),
                     toolbox=make_toolbox(cfg.tools, server.url if server else None),
                     judge=make_judge(cfg.reward))
        primary = jax.process_index() == 0
        model = build_model(cfg, mesh)
        with metrics_lib.MetricsWriter(rt.path("sft"), enabled=primary) as sft_writer:
            graphdef, sft_state = run_sft(rt, model, sft_writer)
        if cfg.train.steps == 0:  # an SFT-only run: a shared start for other runs
            log.info("train.steps = 0: SFT only, checkpoints in %s", rt.path("checkpoints", "sft"))
            return _write_summary(rt, {"workdir": files.absolute(workdir), "sft_only": True})
        # The full evaluations after SFT and after RL carry the validation curve's first and last
        # points; the evaluations every train.eval_every steps are its points in between.
        curve = eval_curve.curve_size(rt)

        def eval_fn(g, s, tag):
            return evaluate_run(rt, g, s, tag=tag, curve_questions=curve)

        def periodic_fn(g, s, tag):
            return eval_curve.evaluate_curve(rt, g, s, tag=tag) if curve else eval_fn(g, s, tag)

        sft_eval = _cached_eval(rt, "sft", lambda: eval_fn(graphdef, model_state(sft_state), "sft"))
        resume_step = latest_rl_step(rt)
        with metrics_lib.MetricsWriter(workdir, enabled=primary, resume_step=resume_step) as writer:
            writer.write_once(0, sft_eval)  # a resumed run has logged it already
            state = run_rl(rt, graphdef, sft_state.params, sft_state.frozen, writer, periodic_fn)
            # eval/final.json is this run's only if the summary says the run finished at this
            # step: a finished run extended by train.steps evaluates its new parameters.
            final_eval = _cached_eval(rt, "final",
                                      lambda: eval_fn(graphdef, model_state(state), "final"),
                                      valid=lambda: _finished_at(rt) == cfg.train.steps)
            writer.write_once(cfg.train.steps, final_eval)
    summary = {"sft_eval": sft_eval, "final_eval": final_eval, "workdir": files.absolute(workdir),
               "mode": cfg.rollout.mode, "rl_steps": cfg.train.steps}
    _write_summary(rt, summary)
    if primary:
        plots.plot_run(rt.path(metrics_lib.METRICS_FILE), rt.path("plots"))
        if files.run_path(rt.path("sft", metrics_lib.METRICS_FILE)).exists():
            plots.plot_run(rt.path("sft", metrics_lib.METRICS_FILE), rt.path("plots"),
                           figures=plots.SFT_FIGURES)
    return summary
