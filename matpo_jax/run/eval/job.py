"""`python -m matpo_jax.evaluate`: a config and a checkpoint -> benchmark results and a table.

    run_benchmarks(cfg, BenchmarkOptions(datasets=["gaia", "frames"], samples=4,
                                         checkpoint="runs/x", workdir="runs/x/bench"))

From the config: the model (`model.*`, restored from the checkpoint), its tokenizer
(`model.tokenizer`, `model.hf_checkpoint` or a Hugging Face checkpoint; else the synthetic
world's, which a model trained here on the world speaks), the rollout settings (`rollout.*`,
temperature `eval.temperature`), the tools (`tools.*`; the local search service needs a corpus:
`corpus`, else MuSiQue's paragraphs or the synthetic world's pages when those are evaluated), the
data (`data.data_dir`, `data.manual_dir/<name>/`) and the judge (`reward.judge_url`,
`reward.judge_model`, `reward.judge_api_key_env`). Each dataset goes through the evaluator a run
uses for a benchmark (benchmark.BenchmarkEvaluator), K samples per question: output in
<workdir>/<dataset>/ (results.jsonl, transcripts.jsonl; each result line records its source:
checkpoint, step, hashes), the table in <workdir>/report.md; the workdir is held (its lock) and the
checkpoint's recorded tokenizer must be the one evaluated with (run/provenance.py). The
synthetic world's wrong answers are also traced to their first failed step (failures.py:
failures.md beside its transcripts, and the table in report.md).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
from typing import Sequence

import jax
from flax import nnx

from matpo_jax.chat import ChatFormat
from matpo_jax.config import ConfigError
from matpo_jax.data import loader as loader_lib
from matpo_jax.data import musique
from matpo_jax.data import world_assets as world_assets_lib
from matpo_jax.report import files
from matpo_jax.data import synthetic_world
from matpo_jax.model import lora as lora_lib
from matpo_jax.run.eval import failures
from matpo_jax.run.eval import summary as summary_lib
from matpo_jax.run.eval.benchmark import BenchmarkEvaluator
from matpo_jax.run.eval.collect import Policy
from matpo_jax.run.eval.grading import make_grader
from matpo_jax.run.eval.questions import load_questions
from matpo_jax.run import provenance
from matpo_jax.run.workdir_lock import workdir_lock
from matpo_jax.run.runtime import (build_model, make_mesh, make_toolbox, rollout_config,
                                   run_chat, tool_calls_per_turn)
from matpo_jax.tools.search_server import SearchServer
from matpo_jax.trainer import checkpoint as ckpt_lib

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BenchmarkOptions:
    datasets: Sequence[str]  # data.name values, optionally with a config: "gaia/all"
    workdir: str
    checkpoint: str | None = None  # run dir, Orbax checkpoint dir or step, or HF directory
    samples: int = 1  # K answers per question (avg@K, pass@K)
    grader: str | None = None  # exact | f1 | judge; None: reward.method
    judge_url: str | None = None  # None: reward.judge_url
    split: str | None = None  # None: the benchmark's own split (eval.split for synthetic)
    num_questions: int = 0  # the first N of the split; 0: all
    corpus: str | None = None  # JSONL corpus for the local search service
    batch_size: int | None = None  # questions per rollout batch; None: decode_slots // samples
    temperature: float | None = None  # None: eval.temperature


def parse_dataset(spec: str) -> tuple[str, str | None]:
    """"gaia/all" -> ("gaia", "all"); "frames" -> ("frames", None)."""
    name, _, config = spec.partition("/")
    if name not in loader_lib.DATASET_NAMES:
        raise ConfigError(f"--datasets: {spec!r} is not a dataset; known datasets are "
                          f"{', '.join(loader_lib.DATASET_NAMES)}")
    return name, config or None


# ----------------------------------------------------------------------------- the model

@dataclasses.dataclass(frozen=True)
class CheckpointSource:
    """The parameters an evaluation samples: an Orbax manager directory and step (None: its
    newest readable one), a Hugging Face directory, or None (the model the config builds)."""
    path: str | None
    step: int | None = None
    hf: bool = False


def checkpoint_directory(path: str) -> tuple[str, int | None]:
    """(Orbax manager directory, step or None for the newest) of a run dir, a manager dir or a
    step dir (<manager>/<step>)."""
    for phase in ("rl", "sft"):  # a run's workdir: its newest phase
        candidate = os.path.join(path, "checkpoints", phase)
        found = files.run_path(candidate)
        if found.is_dir() and any(p.name.isdigit() for p in found.iterdir()):
            return candidate, None
    # normpath would fold the "//" of a URI
    trimmed = path.rstrip("/") if files.is_remote(path) else os.path.normpath(path)
    name = os.path.basename(trimmed)
    if name.isdigit():
        return os.path.dirname(trimmed), int(name)
    return path, None


def is_hf_checkpoint(path: str) -> bool:
    directory = files.run_path(path)
    return (directory / "config.json").exists() and any(
        p.name.endswith((".safetensors", ".safetensors.index.json")) for p in directory.iterdir())


def locate_checkpoint(checkpoint: str | None) -> CheckpointSource:
    """What --checkpoint names (ConfigError, one line, when it names nothing)."""
    if not checkpoint:
        return CheckpointSource(None)
    if is_hf_checkpoint(checkpoint):
        return CheckpointSource(checkpoint, hf=True)
    directory, step = checkpoint_directory(checkpoint)
    if not files.run_path(directory).is_dir():
        raise ConfigError(f"--checkpoint={checkpoint}: no such directory")
    return CheckpointSource(directory, step)


def restore_source(cfg, mesh, source: CheckpointSource):
    """(graphdef, model state, step restored) of `model.*` with the parameters `source` names.
    A Hugging Face directory is loaded as `model.hf_checkpoint`; an Orbax checkpoint of this
    code's trainer gives only its parameters (the optimizer state is not read): the step asked
    for, else the newest that restores (a damaged newer one is skipped with one warning, never
    moved: the run is not the evaluation's to change)."""
    if source.hf:
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model,
                                                                 hf_checkpoint=source.path))
        return (*nnx.split(build_model(cfg, mesh)), None)
    # With LoRA a checkpoint holds the adapters alone: they restore over the built base.
    graphdef, params, frozen = lora_lib.split_trainable(build_model(cfg, mesh))
    step = None
    if source.path:
        with ckpt_lib.Checkpointer(source.path, async_save=False) as checkpoints:
            if source.step is None:
                try:
                    restored = checkpoints.restore_latest(params, set_aside=False)
                except RuntimeError as error:  # none restores: one line naming the newest
                    raise ConfigError(f"--checkpoint: {error}") from None
                if restored is None:
                    raise ConfigError(f"--checkpoint: no checkpoint in {source.path}")
            elif source.step not in checkpoints.all_steps():
                raise ConfigError(f"--checkpoint: {source.path} has no step {source.step} "
                                  f"(steps: {sorted(checkpoints.all_steps())})")
            else:
                try:
                    restored = checkpoints.restore(source.step, params)
                except Exception as error:  # noqa: BLE001 - any failure to read: one line
                    detail = (str(error).strip().splitlines() or [""])[0][:200]
                    raise ConfigError(f"--checkpoint: step {source.step} of {source.path} does "
                                      f"not restore ({type(error).__name__}: {detail})") from None
            params, step = restored.params, restored.step
        log.info("restored parameters of step %d from %s", step, source.path)
    return graphdef, nnx.merge_state(params, frozen), step


def restore_model(cfg, mesh, checkpoint: str | None):
    """(graphdef, model state) of `model.*` with the parameters `checkpoint` names: a run's
    workdir, an Orbax manager or step directory, or a Hugging Face directory (a directory with a
    config.json and safetensors weights; a run's workdir, whose config.json is the run's config,
    has no weights)."""
    graphdef, state, _ = restore_source(cfg, mesh, locate_checkpoint(checkpoint))
    return graphdef, state


def checked_identity(cfg, source: CheckpointSource, step: int | None, chat) -> dict | None:
    """The identity checkpoint `step` of `source` records, after checking that `chat`'s
    tokenizer is the one it was trained with (provenance.ArtifactMismatch otherwise)."""
    if source.path is None or source.hf or step is None:
        return None
    identity = provenance.read_identity(source.path, step)
    provenance.check_tokenizer(identity, chat.tokenizer,
                               checkpoint=os.path.join(source.path, str(step)),
                               source="the tokenizer this evaluation reads with", config=cfg)
    return identity


def evaluation_source(cfg, source: CheckpointSource, step: int | None, identity: dict | None,
                      chat, temperature: float) -> dict:
    """What every result line records about what produced it; a resume into the same directory
    must match it (results.resume): the parameters (path, step, the run's hashes), the tokenizer,
    this evaluation's config and temperature."""
    return {**provenance.source_identity(source.path, step, identity),
            "tokenizer_sha256": provenance.tokenizer_sha256(chat.tokenizer),
            "eval_config_sha256": provenance.config_sha256(cfg),
            "temperature": float(temperature)}


# ----------------------------------------------------------------------------- the pieces

def tokenizer_dir(cfg, checkpoint: str | None = None) -> str | None:
    """Where the tokenizer is: `model.tokenizer`, `model.hf_checkpoint` or a Hugging Face
    `checkpoint` (the first with a tokenizer.json); None: the synthetic world's own."""
    for path in (cfg.model.tokenizer, cfg.model.hf_checkpoint, checkpoint):
        if path and os.path.exists(os.path.join(path, "tokenizer.json")):
            return path
    return None


def _corpus(cfg, options, specs, data_dir, world_assets) -> str | None:
    """The corpus the local search service serves (None: the tools are remote)."""
    if cfg.tools.search_backend != "local" or cfg.tools.search_url:
        return None
    if options.corpus:
        return options.corpus
    for name, config in specs:
        if name == "musique":
            builder = musique.prepare_dataset(config or "ans", data_dir=data_dir, manual_dir=(
                os.path.join(cfg.data.manual_dir, "musique") if cfg.data.manual_dir else None))
            return musique.corpus_path(builder)
        if name == loader_lib.SYNTHETIC:
            return world_assets.corpus_path
    raise ConfigError("tools.search_backend='local' needs a corpus to search: pass --corpus "
                     "(JSONL of id/title/contents), or set tools.search_url to a search service")


def output_name(name: str, config) -> str:
    config = config if config is None or isinstance(config, str) else config.name
    return name if not config else re.sub(r"\W", "_", f"{name}_{config}")


# ----------------------------------------------------------------------------- the job

def _diagnoses(workdir: str, specs, world_assets) -> str:
    """The failure tables of the synthetic world's evaluations (markdown, for report.md)."""
    labels = [output_name(name, config) for name, config in specs
              if name == loader_lib.SYNTHETIC]
    if not labels:
        return ""
    # Every synthetic spec is evaluated in the configured world (questions.load_questions).
    world = synthetic_world.build_world(**world_assets.config.world_kwargs())
    sections = []
    for label in labels:
        table = failures.write_diagnosis(os.path.join(workdir, label), world)
        sections.append(f"## {label}: the first failed step of each sample\n\n{table}")
    return "\n".join(sections)


def run_benchmarks(cfg, options: BenchmarkOptions) -> dict[str, dict]:
    """Evaluates every dataset of `options` and writes <workdir>/report.md; returns the numbers
    per dataset and group (summary.GroupSummary as dicts). One evaluation per workdir: process 0
    holds its lock (run/workdir_lock.py) from before the first write to the end."""
    specs = [parse_dataset(spec) for spec in options.datasets]
    if options.samples < 1:
        raise ConfigError(f"--samples={options.samples} must be >= 1")
    source = locate_checkpoint(options.checkpoint)
    files.makedirs(options.workdir)
    with workdir_lock(options.workdir) if jax.process_index() == 0 else contextlib.nullcontext():
        return _run_benchmarks(cfg, options, specs, source)


def _run_benchmarks(cfg, options: BenchmarkOptions, specs, source: CheckpointSource):
    data_dir = cfg.data.data_dir or files.local_dir_for(options.workdir, "tfds")
    tokenizer = tokenizer_dir(cfg, options.checkpoint)
    world_assets = None
    if tokenizer is None or any(name == loader_lib.SYNTHETIC for name, _ in specs):
        # a model trained here on the synthetic world speaks the world's tokenizer
        world_assets = world_assets_lib.prepare_world(cfg, data_dir)
    chat = run_chat(cfg, ChatFormat.from_pretrained(tokenizer) if tokenizer
                    else world_assets.chat)
    questions = {(name, config): load_questions(cfg, name, config, split=options.split,
                                                num_questions=options.num_questions,
                                                data_dir=data_dir)
                 for name, config in specs}
    grader = make_grader(cfg.reward, options.grader, options.judge_url)
    mesh = make_mesh(cfg)
    graphdef, model_state, step = restore_source(cfg, mesh, source)
    identity = checked_identity(cfg, source, step, chat)
    rollout_cfg = dataclasses.replace(rollout_config(cfg, evaluation=True),
                                      group_size=options.samples)
    if options.temperature is not None:
        rollout_cfg = dataclasses.replace(rollout_cfg, temperature=float(options.temperature))
    if options.samples > 1 and rollout_cfg.temperature == 0:
        log.warning("%d samples at temperature 0 are %d copies of one answer: set "
                    "--temperature (or eval.temperature) above 0 for avg@K / pass@K",
                    options.samples, options.samples)
    produced_by = evaluation_source(cfg, source, step, identity, chat, rollout_cfg.temperature)
    batch_size = options.batch_size or max(1, cfg.rollout.decode_slots // options.samples)
    corpus = _corpus(cfg, options, specs, data_dir, world_assets)

    summaries = {}
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(SearchServer(corpus)) if corpus else None
        if server is not None:
            log.info("local search service over %s", corpus)
        policy = Policy(graphdef, model_state, chat,
                        make_toolbox(cfg.tools, server.url if server is not None else None),
                        rollout_cfg, cfg.train.seed, tool_calls_per_turn(cfg))
        for (name, config), qs in questions.items():
            label = output_name(name, config)
            evaluator = BenchmarkEvaluator(label, qs, grader, batch_size=batch_size,
                                           out_dir=os.path.join(options.workdir, label),
                                           source=produced_by)
            summaries.update(evaluator.run(policy).summaries)
    if jax.process_index() == 0:
        at_step = f" (step {step})" if step is not None else ""
        header = (f"# Benchmark evaluation\n\ncheckpoint: {options.checkpoint or '(none)'}"
                  f"{at_step}; mode: {rollout_cfg.mode}; samples: {options.samples}; "
                  f"temperature: {rollout_cfg.temperature:g}; grader: {grader.method}")
        footer = _diagnoses(options.workdir, specs, world_assets)
        summary_lib.write_report(options.workdir, summaries, header, footer)
    return {label: {group: dataclasses.asdict(s) for group, s in groups.items()}
            for label, groups in summaries.items()}
