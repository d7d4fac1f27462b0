"""The reading warm start: pretrain model.arch on reading tasks, measure, export.

    summary = run_pretrain(cfg, workdir, out_dir)

The world (its names, page templates and trained tokenizer) comes from cfg.data as for any run;
the model is built from model.arch (a warm start is never trained from another one). Training
goes through the same train step (objective "sft": cross-entropy on the fact lines) and loop as
SFT, with checkpoints in <workdir>/checkpoints/pretrain, so a killed rebuild resumes. At the end
reading accuracy is measured on held-out tasks and the model is written to `out_dir` as a Hugging
Face directory (config.json, model.safetensors, the world's tokenizer and chat template) with
warm_start.json: the sha256 of the weights, the accuracy, the steps, the command and the files
written. `out_dir` must be a directory pretrain owns (new, empty, or an earlier warm start:
run/output_dir.py), checked before training.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from matpo_jax.agents.trajectory import ROLE_IDS, SINGLE
from matpo_jax.chat import ChatFormat
from matpo_jax.config import ExperimentConfig
from matpo_jax.config.sections import LoRASection
from matpo_jax.config.validation import file_sha256
from matpo_jax.data import synthetic_world
from matpo_jax.data.reading_tasks import ReadingExample, ReadingTaskWriter
from matpo_jax.data.world_assets import prepare_world, world_config
from matpo_jax.model import save_pretrained
from matpo_jax.report import metrics as metrics_lib
from matpo_jax.report import files
from matpo_jax.run import output_dir, provenance
from matpo_jax.run.runtime import build_model, make_mesh, step_config
from matpo_jax.run.workdir_lock import workdir_lock
from matpo_jax.trainer import loop as loop_lib
from matpo_jax.trainer import packing
from matpo_jax.trainer import step as step_lib
from matpo_jax.trainer.packing import TrainSequence

log = logging.getLogger(__name__)
WARM_START_FILE = "warm_start.json"
# The writers' seeds: held-out tasks and SFT's rehearsal are other draws than pretraining's.
TRAIN_STREAM, EVAL_STREAM, REHEARSAL_STREAM = 0, 1, 2
EXAMPLES_PER_STEP = 4096  # indices reserved per step (a step uses far fewer)
EVAL_ROWS = 16


def writer_settings(cfg: ExperimentConfig) -> dict:
    """The reading tasks' settings: the pretrain section's, the world's fact style, and the
    open tool's cap (pages are shown as a worker sees them)."""
    p = cfg.pretrain
    return dict(noise=(0.0, p.noise_max), fact_style=cfg.data.fact_style,
                max_response_chars=cfg.tools.max_response_chars,
                two_hop_fraction=p.two_hop_fraction, distractor_rate=p.distractor_rate,
                listing_fraction=p.listing_fraction)


def reading_writer(cfg: ExperimentConfig, world: synthetic_world.World,
                   stream: int, **overrides) -> ReadingTaskWriter:
    return ReadingTaskWriter(world.entities, seed=cfg.train.seed * 1000 + stream,
                             **{**writer_settings(cfg), **overrides})


def tokenize_example(chat: ChatFormat, example: ReadingExample) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and the trained mask, segment by segment (segments end in a newline, which the
    world tokenizer never merges with what follows, so this equals tokenizing the whole text)."""
    ids, trained = [], []
    for text, is_trained in example.segments:
        piece = chat.tokenizer.encode(text, add_special_tokens=False)
        ids += piece
        trained += [is_trained] * len(piece)
    return np.asarray(ids, np.int32), np.asarray(trained, bool)


def reading_sequence(chat: ChatFormat, example: ReadingExample, k: int) -> TrainSequence:
    tokens, trained = tokenize_example(chat, example)
    return TrainSequence(tokens=tokens, trainable=trained,
                         old_logprobs=np.zeros(len(tokens), np.float32), advantage=1.0,
                         role_id=ROLE_IDS[SINGLE], rollout_id=k, group_id=k)


def reading_batch(chat: ChatFormat, writer: ReadingTaskWriter, step: int, rows: int,
                  max_len: int, loss_config) -> packing.PackedBatch:
    """Step `step`'s batch: reading tasks in index order, each row filled until the next does
    not fit (a pure function of the writer's seed and the step)."""
    seqs, bins, row, used = [], [[] for _ in range(rows)], 0, 0
    for index in range(step * EXAMPLES_PER_STEP, (step + 1) * EXAMPLES_PER_STEP):
        seq = reading_sequence(chat, writer.example(index), len(seqs))
        if len(seq) > max_len:
            continue
        if used + len(seq) > max_len:
            row, used = row + 1, 0
            if row == rows:
                break
        seqs.append(seq)
        bins[row].append(len(seqs) - 1)
        used += len(seq)
    return packing.layout_bins(seqs, bins, rows, max_len, max_len, loss_config)


def reading_accuracy(model, chat: ChatFormat, writer: ReadingTaskWriter, count: int) -> dict:
    """Held-out tasks, teacher-forced: the share whose first fact line (and whose whole set of
    trained lines) every next-token argmax gets right, i.e. what greedy decoding would write
    after the question and page(s). Per kind and overall."""
    graphdef, params = nnx.split(model)

    @jax.jit
    def predict(params, tokens):
        return jnp.argmax(nnx.merge(graphdef, params)(tokens), -1)

    encoded = [(writer.example(i), *tokenize_example(chat, writer.example(i)))
               for i in range(count)]
    width = packing.round_up(max(len(ids) for _, ids, _ in encoded), 64)
    hits = collections.defaultdict(list)
    for start in range(0, count, EVAL_ROWS):
        chunk = encoded[start:start + EVAL_ROWS]
        tokens = np.zeros((EVAL_ROWS, width), np.int32)
        for row, (_, ids, _) in enumerate(chunk):
            tokens[row, :len(ids)] = ids
        predicted = np.asarray(predict(params, jnp.asarray(tokens)))
        for row, (example, ids, trained) in enumerate(chunk):
            right = np.zeros(len(ids), bool)
            right[1:] = predicted[row, :len(ids) - 1] == ids[1:]
            runs = np.flatnonzero(np.diff(np.concatenate([[0], trained.astype(int), [0]])))
            first = right[runs[0]:runs[1]].all()
            whole = right[trained].all()
            for key in ("all", example.kind):
                hits[f"pretrain/first_fact_exact/{key}"].append(first)
                hits[f"pretrain/all_lines_exact/{key}"].append(whole)
    return {key: float(np.mean(values)) for key, values in sorted(hits.items())}


def rehearsal_overrides(cfg: ExperimentConfig) -> dict:
    """How SFT's rehearsal tasks differ from pretraining's: their own share of listings."""
    return dict(listing_fraction=cfg.sft.rehearsal_listings)


def rehearsal_batches(rt, rows: int, loss_config):
    """step -> a reading batch, for SFT's rehearsal steps (sft.rehearsal = reading): keeps the
    warm start's reading while SFT teaches the protocol."""
    cfg = rt.cfg
    world = synthetic_world.build_world(**world_config(cfg).world_kwargs())
    writer = reading_writer(cfg, world, REHEARSAL_STREAM, **rehearsal_overrides(cfg))
    return lambda step: reading_batch(rt.chat, writer, step, rows, cfg.rl.pack_len, loss_config)


def pretrain_optimizer_config(cfg: ExperimentConfig) -> step_lib.OptimizerConfig:
    steps = cfg.pretrain.steps
    return step_lib.OptimizerConfig(learning_rate=cfg.pretrain.lr, schedule="warmup_cosine",
                                    warmup_steps=min(50, max(steps // 20, 1)),
                                    decay_steps=max(steps, 1), end_lr_ratio=0.1,
                                    weight_decay=cfg.rl.weight_decay, grad_clip=cfg.rl.grad_clip)


def pretrain_loop_config(cfg: ExperimentConfig, workdir: str,
                         chat: ChatFormat | None = None) -> loop_lib.LoopConfig:
    """Checkpoints every tenth of the phase in <workdir>/checkpoints/pretrain (a killed rebuild
    resumes), written synchronously (the phase is short and a warm start must be whole); each
    records the config and `chat`'s tokenizer (run/provenance.py)."""
    identity = {} if chat is None else {
        provenance.IDENTITY_KEY: provenance.checkpoint_identity(cfg, chat)}
    return loop_lib.LoopConfig(name="pretrain", steps=cfg.pretrain.steps,
                               checkpoint_metadata=identity,
                               checkpoint_dir=os.path.join(workdir, "checkpoints", "pretrain"),
                               checkpoint_every=max(cfg.pretrain.steps // 10, 1),
                               keep_checkpoints=2, async_checkpointing=False,
                               log_every=cfg.train.log_every, seed=cfg.train.seed,
                               metric_prefix="pretrain/", progress_keys=("pretrain/loss",))


def batch_rows(cfg: ExperimentConfig, row_multiple: int) -> int:
    return packing.round_up(cfg.pretrain.batch_size, row_multiple)


def eval_count(cfg: ExperimentConfig) -> int:
    return cfg.pretrain.eval_examples


def from_scratch(cfg: ExperimentConfig) -> ExperimentConfig:
    """The config a warm start is built under: model.arch, the world's own trained tokenizer,
    every parameter trained (model.lora is for the runs that start from the warm start)."""
    return dataclasses.replace(cfg, model=dataclasses.replace(
        cfg.model, hf_checkpoint=None, hf_checkpoint_sha256="", tokenizer=None,
        lora=LoRASection()))


def machine_description() -> dict:
    """Where the weights were computed: float rounding differs by processor, so a rebuild on
    another kind of machine gives other bytes (and another sha256)."""
    device = jax.devices()[0]
    return {"platform": device.platform, "device_kind": device.device_kind,
            "device_count": jax.device_count(), "jax": jax.__version__,
            "matmul_precision": str(jax.config.jax_default_matmul_precision)}


def run_pretrain(cfg: ExperimentConfig, workdir: str, out_dir: str, *,
                 command: str = "") -> dict:
    """Trains (or resumes) the reading warm start and writes it to `out_dir`; its summary.
    `out_dir` must be new, empty or an earlier warm start (run/output_dir.py: checked before any
    training), and is replaced whole once the new one is written. The workdir is held
    (run/workdir_lock.py) as train holds it."""
    previous = output_dir.claim(out_dir, WARM_START_FILE, writer="pretrain")
    files.makedirs(workdir)
    with workdir_lock(workdir) if jax.process_index() == 0 else contextlib.nullcontext():
        return _pretrain(cfg, workdir, out_dir, previous, command)


def _pretrain(cfg: ExperimentConfig, workdir: str, out_dir: str, previous: list[str],
              command: str) -> dict:
    cfg = from_scratch(cfg)
    started = time.time()
    data_dir = cfg.data.data_dir or os.path.join(workdir, "tfds")
    assets = prepare_world(cfg, data_dir)
    world = synthetic_world.build_world(**world_config(cfg).world_kwargs())
    mesh = make_mesh(cfg)
    model = build_model(cfg, mesh)
    scfg = step_config(cfg, "sft")
    loop = loop_lib.TrainLoop(pretrain_loop_config(cfg, workdir, assets.chat), model,
                              pretrain_optimizer_config(cfg), scfg, mesh)
    writer = reading_writer(cfg, world, TRAIN_STREAM)
    rows = batch_rows(cfg, scfg.row_multiple(mesh))
    with metrics_lib.MetricsWriter(workdir) as metrics:  # <workdir>/metrics.jsonl, TensorBoard
        state = loop.run(lambda step, _: loop_lib.StepBatch(
            reading_batch(assets.chat, writer, step, rows, cfg.rl.pack_len, scfg.loss)),
            writer=metrics)
    nnx.update(model, state.params)
    accuracy = reading_accuracy(model, assets.chat, reading_writer(cfg, world, EVAL_STREAM),
                                eval_count(cfg))
    log.info("reading accuracy: %s", json.dumps(accuracy))
    stage = output_dir.staging_dir(out_dir)
    try:
        save_pretrained(model, stage)
        for name in os.listdir(assets.tokenizer_dir):  # tokenizer.json, its config, chat template
            shutil.copy(os.path.join(assets.tokenizer_dir, name), os.path.join(stage, name))
        weights = os.path.join(stage, "model.safetensors")
        summary = {"sha256": file_sha256(weights), "bytes": os.path.getsize(weights),
                   "parameters": int(sum(x.size for x in jax.tree.leaves(state.params))),
                   "steps": cfg.pretrain.steps, "pretrain": dataclasses.asdict(cfg.pretrain),
                   "world": world_config(cfg).world_kwargs(), "accuracy": accuracy,
                   "wall_s": round(time.time() - started, 1), "command": command,
                   "machine": machine_description(), "files": sorted(os.listdir(stage))}
        with open(os.path.join(stage, WARM_START_FILE), "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1, sort_keys=True)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    output_dir.publish(stage, out_dir, previous, WARM_START_FILE)
    return summary
