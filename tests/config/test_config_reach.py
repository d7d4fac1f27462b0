"""Every leaf of the config reaches its consumer: changing the value changes what the consumer
receives. A field without an entry in REACH fails the test, so no field can be silently ignored.

Each entry names the consumer that receives the field (a translator of run/runtime.py, a stage's
own settings object, the tool clients, the SFT and RL phases' own functions...) as a probe
`typed config -> what the consumer gets`: the consumer itself runs, with what it would hand on
(the model, the oracle, the checkpoint store...) replaced by recorders.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import re
import tempfile
import types
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

from matpo_jax.config import (RolloutSection, apply_overrides, base_config,
                              schema, to_typed)
from matpo_jax.data import world_assets
from matpo_jax.run import copy_pretraining, experiment, runtime
from matpo_jax.run.eval import curve as eval_curve
from matpo_jax.run.eval import world as eval_world
from matpo_jax.run import rl as rl_phase
from matpo_jax.run import sft as sft_phase

REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------------- the probes
def built_model(cfg):
    """What build_model hands the model constructor / the HF loader (no weights are built)."""
    calls = []
    with mock.patch.object(runtime, "load_pretrained",
                           lambda path, **kw: calls.append(("hf", path, kw["dtype"], kw["param_dtype"],
                                                                kw["attention"]))), \
            mock.patch.object(runtime, "CausalLM",
                              lambda config, rngs: calls.append(("fresh", config, rngs))), \
            mock.patch.object(runtime.nnx, "Rngs", lambda seed: ("rngs", seed)), \
            mock.patch.object(runtime.parallel, "shard_model", lambda model, mesh: model):
        runtime.build_model(cfg, mesh=None)
    return calls


def lora_adapters(cfg):
    """The adapters build_model gives the model (runtime.lora_config's translation)."""
    return runtime.lora_config(cfg.model)


def mesh_shape(cfg):
    return runtime.mesh_shape(cfg.mesh, 8)


def world(cfg):
    return world_assets.world_config(cfg)


def data_dir(cfg):
    return experiment.world_data_dir(cfg.data, "/runs/x")


def rollout_engine(cfg):
    return runtime.rollout_config(cfg)


def eval_rollouts(cfg):
    return runtime.rollout_config(cfg, evaluation=True)


def eval_questions(cfg):
    return eval_world.eval_selection(cfg.eval, {"validation": 100, "test": 90, "train": 80})


def curve_questions(cfg):
    return eval_curve.curve_selection(cfg.eval, {"validation": 100, "test": 90, "train": 80})


def _settings_of(obj, depth=0):
    """The public settings of a client object graph, comparable with ==."""
    if obj is None or isinstance(obj, (str, int, float, bool, tuple)) \
            or dataclasses.is_dataclass(obj) or depth > 3:
        return obj
    if hasattr(obj, "__dict__"):
        return (type(obj).__name__, tuple(sorted(
            (name, _settings_of(value, depth + 1)) for name, value in vars(obj).items()
            if not name.startswith("_") and name not in ("metrics", "transport", "session"))))
    return type(obj).__name__


def tool_clients(cfg):
    box = runtime.make_toolbox(cfg.tools, "http://127.0.0.1:9")
    return _settings_of(box.clients["search"]), _settings_of(box.clients["open"])


def tool_calls_per_turn(cfg):
    """The cap run_rollouts receives (run/rl.py, run/eval/registry.py, the benchmark job)."""
    return runtime.tool_calls_per_turn(cfg)


class _ModeRecorder:
    """Stands for the tokenizer's ChatFormat: records the mode the run asks for."""

    def with_thinking(self, enable_thinking):
        return ("chat format, thinking", enable_thinking)


def chat_mode(cfg):
    """The chat format the run's Runtime gets (run/experiment.py, the benchmark job)."""
    return runtime.run_chat(cfg, _ModeRecorder())


def rewards(cfg):
    return runtime.reward_config(cfg)


def judge(cfg):
    return runtime.make_judge(cfg.reward).config


def rl_optimizer(cfg):
    return runtime.optimizer_config(cfg, "rl")


def sft_optimizer(cfg):
    return runtime.optimizer_config(cfg, "sft")


def rl_step(cfg):
    return runtime.step_config(cfg, "rl")


def tokenizer_source(cfg):
    """Which Hugging Face tokenizer directory a run uses (None: the world's trained one)."""
    return world_assets.configured_tokenizer(cfg)


def rl_questions(cfg):
    """The RL question stream (run/rl.py question_loader): split, batch size, seed, which
    questions (SFT-demonstrated ones left out with data.rl_skips_demonstrated)."""
    sources = {split: list(range(400)) for split in ("train", "validation", "test", "sft")}
    made = []
    rt = types.SimpleNamespace(cfg=cfg, assets=types.SimpleNamespace(
        source=lambda split: rl_phase.loader_lib.open_source()[split]))
    with mock.patch.object(rl_phase.loader_lib, "open_source", lambda *a, **k: sources), \
            mock.patch.object(rl_phase.loader_lib, "SubsetSource",
                              lambda source, indices: ("subset", tuple(indices))), \
            mock.patch.object(rl_phase.loader_lib, "make_loader",
                              lambda split, batch_size, seed, source: made.append(
                                  (split, batch_size, seed, source))):
        rl_phase.question_loader(rt)
    return made


def task(cfg):
    """What the run's task assets prepare (data/task_assets.py): the synthetic world, or a
    published dataset from its manual dir (nothing is built here)."""
    from matpo_jax.data import task_assets
    calls = []
    fake_builder = types.SimpleNamespace(data_dir="/data/tfds/musique/ans/1.0.0")
    published = types.SimpleNamespace(prepare_dataset=lambda config, manual_dir, data_dir: (
        calls.append(("published", config, manual_dir, data_dir)) or fake_builder))
    world = types.SimpleNamespace(config="world", corpus_path="c", tokenizer_dir="t", chat=None)
    with mock.patch.object(task_assets.world_assets_lib, "prepare_world",
                           lambda cfg, data_dir: calls.append(("world", data_dir)) or world), \
            mock.patch.object(task_assets.world_assets_lib, "checkpoint_tokenizer",
                              lambda cfg: ("/ckpt/tokenizer", None)), \
            mock.patch.object(task_assets.world_assets_lib, "exclusive",
                              lambda data_dir: contextlib.nullcontext()), \
            mock.patch.dict(task_assets.loader_lib.PUBLISHED,
                            {"musique": (published, "ans", "validation")}):
        assets = task_assets.prepare_task(cfg, "/data/tfds")
    return calls, assets.name, assets.corpus_path


def evaluated_datasets(cfg):
    """The evaluators run/eval/registry.py builds for eval.datasets, in order (nothing run)."""
    from matpo_jax.run.eval import protocol, registry
    calls = []

    def fake(rt, name, tag, curve_questions):
        calls.append(name)
        return types.SimpleNamespace(run=lambda policy: protocol.Evaluation({}))

    rt = types.SimpleNamespace(cfg=cfg, chat=None, toolbox=None,
                               path=lambda *parts: "/".join(("/runs/x",) + parts))
    with mock.patch.dict(registry.EVALUATORS, {name: fake for name in registry.EVALUATORS}), \
            mock.patch.object(registry.report, "write_evaluation", lambda *a, **k: None):
        registry.evaluate_run(rt, None, None, tag="final")
    return calls


def rl_batches(cfg):
    """What rl/batch.matpo_batch receives from the RL phase (packing and advantage settings)."""
    calls = []
    rt = types.SimpleNamespace(cfg=cfg, judge=None)
    with mock.patch.object(rl_phase.rewards_lib, "rollout_rewards", lambda *a, **k: {}), \
            mock.patch.object(rl_phase.rewards_lib, "reward_metrics", lambda b: {}), \
            mock.patch.object(rl_phase.batch_lib, "matpo_batch",
                              lambda *a, **kw: calls.append(kw) or types.SimpleNamespace(
                                  batch=None, metrics={}, advantages={})):
        rl_phase.rl_batch(rt, [], [], [], "loss-config", 1)
    return calls


def training_loops(cfg):
    """What the one training loop (trainer/loop.py) receives in each phase."""
    return tuple(runtime.loop_config(cfg, phase, "/runs/x/checkpoints")
                 for phase in ("copy", "sft", "rl"))


def pretrain_phase(cfg):
    """What the warm start's build hands its optimizer, loop, reading tasks, batches and
    measurement (run/pretrain.py)."""
    from matpo_jax.run import pretrain
    return (pretrain.pretrain_optimizer_config(cfg), pretrain.pretrain_loop_config(cfg, "/w"),
            pretrain.writer_settings(cfg), pretrain.batch_rows(cfg, 1),
            pretrain.eval_count(cfg))


def checked_weights(cfg):
    """The validation's verdict on model.hf_checkpoint's weights (a directory with a file)."""
    from matpo_jax.config import validation
    return validation._checksum_problems(cfg)


WEIGHTS_DIR = tempfile.mkdtemp(prefix="matpo-reach-weights-")
with open(os.path.join(WEIGHTS_DIR, "model.safetensors"), "wb") as _f:
    _f.write(b"weights")


def demonstrated_questions(cfg):
    """Which records of the demonstration split SFT demonstrates (run/sft.py)."""
    return tuple(sft_phase.demonstrated_indices(cfg, 1000))


def sft_demonstrations(cfg):
    """What SFT hands the oracle (its detours, the single agent's fact lines, the report's order)
    and the demonstration writer (the modes)."""
    calls = []
    rt = types.SimpleNamespace(cfg=cfg, toolbox=None, chat=None,
                               assets=types.SimpleNamespace(source=lambda split: []))
    with mock.patch.object(sft_phase, "Oracle", lambda *a, **kw: calls.append(
            ("oracle", kw["imperfection"], kw["single_states_facts"], kw["report_fact_first"]))
            or "oracle"), \
            mock.patch.object(sft_phase, "demonstrations", lambda oracle, questions, modes: (
                calls.append(("modes", modes)) or [])), \
            mock.patch.object(sft_phase, "demonstration_sequences", lambda *a: ["sequence"]):
        sft_phase.build_sft_sequences(rt)
    return calls


def sft_worker_share(cfg):
    """The share of worker conversations SFT keeps, and the seed of the draw."""
    calls = []
    rt = types.SimpleNamespace(cfg=cfg, toolbox=None, chat=None,
                               assets=types.SimpleNamespace(source=lambda split: []))
    with mock.patch.object(sft_phase, "Oracle", lambda *a, **kw: "oracle"), \
            mock.patch.object(sft_phase, "demonstrations", lambda *a: []), \
            mock.patch.object(sft_phase, "demonstration_sequences", lambda *a: ["sequence"]), \
            mock.patch.object(sft_phase, "thin_workers", lambda seqs, fraction, rng: (
                calls.append((fraction, int(rng.integers(1 << 30)))) or seqs)):
        sft_phase.build_sft_sequences(rt)
    return calls


def sft_loss_weights(cfg):
    """The loss weights SFT's demonstration batches get (copied spans, context tokens)."""
    calls = []
    with mock.patch.object(sft_phase.packing, "layout_bins", lambda *a: "batch"), \
            mock.patch.object(sft_phase, "add_context_lm",
                              lambda batch, seqs, bins, weight: calls.append(("context", weight))), \
            mock.patch.object(sft_phase, "copy_loss_scale",
                              lambda batch, seqs, bins, weight: calls.append(("copy", weight))):
        sft_phase._demonstration_batch(cfg, ["s"], [[0]], 0, 1, 8, "loss")
    return calls


def sft_batches(cfg):
    """What SFT's batch function builds and serves: its rows, copy pre-training before step 0,
    and which steps are rehearsal batches of which kind (copy spans or reading tasks)."""
    calls = []
    rt = types.SimpleNamespace(cfg=cfg, mesh=None)
    scfg = types.SimpleNamespace(row_multiple=lambda mesh: 1, loss="loss")
    state = types.SimpleNamespace(replace=lambda params: params)
    with mock.patch.object(sft_phase.copy_lib, "run_copy_pretraining",
                           lambda rt, model: calls.append("copy pre-training") or "params"), \
            mock.patch.object(sft_phase, "build_sft_sequences",
                              lambda rt: [np.zeros(cfg.rl.pack_len)] * 40), \
            mock.patch.object(sft_phase.copy_lib, "copy_batches",
                              lambda rt, rows, loss: lambda step: ("copy", rows)), \
            mock.patch.object(sft_phase.pretrain_lib, "rehearsal_batches",
                              lambda rt, rows, loss: lambda step: ("reading", rows)), \
            mock.patch.object(sft_phase, "_demonstration_batch",
                              lambda cfg, seqs, bins, step, rows, *a: types.SimpleNamespace(
                                  rows=rows, efficiency=lambda: 1.0)):
        batches = sft_phase._SFTBatches(rt, "model", scfg)
        batches.prepare(0, state)
        served = [batches(step, None) for step in range(6)]
    return calls, [(b.batch if not b.log else b.batch.rows) for b in served]


def rehearsal_tasks(cfg):
    """How SFT's reading rehearsal (sft.rehearsal = reading) draws its tasks."""
    from matpo_jax.run import pretrain
    return pretrain.rehearsal_overrides(cfg)


def shared_sft_start(cfg):
    """Where SFT's start comes from: its own training, or another run's SFT checkpoints."""
    opened = []

    class Checkpoints:
        def __init__(self, directory):
            opened.append(directory)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def restore_latest(self, params, set_aside=True):
            return types.SimpleNamespace(params="shared params", step=3, metadata={})

    loop = types.SimpleNamespace(graphdef="graphdef",
                                 state=types.SimpleNamespace(params=None,
                                                             replace=lambda params: params),
                                 run=lambda batches, writer, on_start: "trained here")
    rt = types.SimpleNamespace(cfg=cfg, mesh=None, path=lambda *parts: "/".join(parts),
                               chat=None)
    with mock.patch.object(sft_phase.loop_lib, "TrainLoop", lambda *a, **kw: loop), \
            mock.patch.object(sft_phase.ckpt_lib, "Checkpointer", Checkpoints):
        _, state = sft_phase.run_sft(rt, "model", writer=None)
    return state, opened


def copy_phase(cfg):
    """What the copy phase hands its optimizer and the copy batches (run/copy_pretraining.py)."""
    made = []
    rt = types.SimpleNamespace(cfg=cfg, chat=types.SimpleNamespace(
        tokenizer=types.SimpleNamespace(encode=lambda text, add_special_tokens: [1])),
        assets=types.SimpleNamespace(corpus_path="corpus"))
    with mock.patch.object(copy_pretraining, "corpus_token_stream",
                           lambda chat, path: np.arange(1000)), \
            mock.patch.object(copy_pretraining, "copy_batch",
                              lambda *a, **kw: made.append(kw)):
        copy_pretraining.copy_batches(rt, 2, "loss")(0)
    return copy_pretraining.copy_optimizer_config(cfg), made


def rl_evaluations(cfg):
    """The RL steps after which the RL phase evaluates (run/rl.py's test in its step body)."""
    return [step for step in range(1, 60) if rl_phase._evaluates_after(cfg.train, step)]


JUDGE = {"reward.method": "judge", "reward.judge_url": "http://127.0.0.1:1/v1"}
REMOTE = {"tools.search_url": "http://127.0.0.1:2"}
# What a run on a published dataset needs (both configs): no SFT, a tokenizer, benchmark evals.
PUBLISHED_RUN = {"sft.steps": 0, "model.tokenizer": "/ckpt/tokenizer",
                 "eval.datasets": ("musique",)}


@dataclasses.dataclass(frozen=True)
class Reach:
    probe: object  # typed config -> what the consumer receives
    new: object = None  # the changed value (None: derived from the default)
    base: dict = dataclasses.field(default_factory=dict)  # overrides both configs share


# leaf -> Reach. Every leaf of the config must be here (test_every_leaf_has_an_entry).
REACH: dict[str, Reach] = {
    "model.hf_checkpoint": Reach(built_model, "/ckpt/qwen3"),
    "model.tokenizer": Reach(tokenizer_source, "/ckpt/tokenizer"),
    "model.hf_checkpoint_sha256": Reach(checked_weights, "0" * 64,
                                        {"model.hf_checkpoint": WEIGHTS_DIR}),
    **{f"pretrain.{f}": Reach(pretrain_phase) for f in (
        "steps", "lr", "batch_size", "noise_max", "two_hop_fraction", "distractor_rate",
        "listing_fraction", "eval_examples")},
    "model.dtype": Reach(built_model),
    "model.param_dtype": Reach(built_model),
    # A fresh model's DecoderConfig and the HF loader both receive model.attention.
    "model.attention.train": Reach(built_model),
    "model.attention.extend": Reach(built_model),
    "model.attention.decode": Reach(built_model, None, {"model.hf_checkpoint": "/ckpt/qwen3"}),
    **{f"model.arch.{name}": Reach(built_model) for name in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "rope_theta",
        "rms_norm_eps", "tie_word_embeddings",
        "max_position_embeddings")},
    "model.arch.num_attention_heads": Reach(built_model, 8),
    "model.arch.num_key_value_heads": Reach(built_model, 1),
    "model.arch.head_dim": Reach(built_model, 32),
    "model.arch.family": Reach(built_model, "llama"),
    "model.lora.rank": Reach(lora_adapters),
    **{f"model.lora.{name}": Reach(lora_adapters, None, {"model.lora.rank": 4})
       for name in ("alpha", "roles")},
    "model.lora.targets": Reach(lora_adapters, ("q_proj", "v_proj"), {"model.lora.rank": 4}),
    "model.lora.base_dtype": Reach(lora_adapters, "bfloat16", {"model.lora.rank": 4}),
    "mesh.data": Reach(mesh_shape, 2),
    "mesh.fsdp": Reach(mesh_shape, 2, {"mesh.data": -1, "mesh.fsdp": 1}),
    "mesh.tensor": Reach(mesh_shape, 2),
    "data.name": Reach(task, "musique", PUBLISHED_RUN),
    "data.split": Reach(rl_questions, "test"),
    "data.data_dir": Reach(data_dir, "/data/tfds"),
    "data.manual_dir": Reach(task, "/data/manual", {**PUBLISHED_RUN, "data.name": "musique"}),
    "data.batch_size": Reach(rl_questions),
    "data.shuffle_seed": Reach(rl_questions),
    "data.rl_skips_demonstrated": Reach(rl_questions, None, {"sft.num_demos": 100}),
    **{f"data.{name}": Reach(world) for name in (
        "world_seed", "fact_style", "noise", "num_entities", "num_questions", "max_hops",
        "sft_fraction", "name_words")},
    **{f"rollout.{f.name}": Reach(rollout_engine) for f in dataclasses.fields(RolloutSection)},
    "rollout.max_context": Reach(rollout_engine, 1024),
    "rollout.worker_max_new_tokens_per_turn": Reach(rollout_engine, 64),
    "rollout.stop_words": Reach(rollout_engine, ("DONE",)),
    "rollout.worker_stop_words": Reach(rollout_engine, ("DONE",)),
    "rollout.worker_temperature": Reach(rl_step, 0.5),  # and the rollout engine
    "tools.search_backend": Reach(tool_clients, "retrieval", REMOTE),
    "tools.search_url": Reach(tool_clients, "http://127.0.0.1:3"),
    "tools.page_url": Reach(tool_clients, "http://127.0.0.1:4"),
    "tools.api_key_env": Reach(tool_clients, "OTHER_SEARCH_KEY"),
    "tools.num_results": Reach(tool_clients),
    "tools.timeout_s": Reach(tool_clients),
    "tools.retries": Reach(tool_clients),
    "tools.max_response_chars": Reach(tool_clients),
    "tools.deadline_s": Reach(tool_clients),
    "tools.page_backend": Reach(tool_clients, "fetch"),
    "tools.reader_url": Reach(tool_clients, "http://127.0.0.1:6", {"tools.page_backend": "reader"}),
    "tools.reader_key_env": Reach(tool_clients, "READER_KEY", {"tools.page_backend": "reader",
                                                                "tools.reader_url": "http://127.0.0.1:6"}),
    "tools.cache_dir": Reach(tool_clients, os.path.join(tempfile.gettempdir(), "matpo-reach-cache")),
    "tools.max_calls_per_turn": Reach(tool_calls_per_turn),
    "chat.enable_thinking": Reach(chat_mode),
    "reward.method": Reach(rewards, "f1"),
    "reward.f1_threshold": Reach(rewards),
    "reward.format_credit": Reach(rewards, "when_correct"),
    "reward.judge_url": Reach(judge, "http://127.0.0.1:5/v1", JUDGE),
    "reward.judge_model": Reach(judge, "other-judge", JUDGE),
    "reward.judge_api_key_env": Reach(judge, "OTHER_JUDGE_KEY", JUDGE),
    "reward.judge_timeout_s": Reach(judge, 7.5, JUDGE),
    "reward.judge_max_retries": Reach(judge, 0, JUDGE),
    **{f"rl.{name}": Reach(rl_optimizer) for name in (
        "lr", "weight_decay", "grad_clip", "warmup_steps", "adam_b1", "adam_b2")},
    "rl.schedule": Reach(rl_optimizer, "cosine"),
    "rl.optimizer": Reach(rl_optimizer, "sgd"),
    **{f"rl.{name}": Reach(rl_step) for name in (
        "eps_low", "eps_high", "dual_clip_c", "loss_agg", "seq_mean_denominator",
        "loss_agg_norm", "kl_type", "entropy_coef", "ppo_mini_batches", "ppo_epochs",
        "micro_batches", "role_grad_norms", "ratio", "rollout_correction", "tis_cap")},
    "rl.kl_coef": Reach(rl_step),
    "rl.norm_by_std": Reach(rl_batches),
    "rl.group_by": Reach(rl_batches),
    "rl.pack_rows": Reach(rl_batches),
    "rl.pack_len": Reach(rl_batches),
    "rl.share_prompts": Reach(rl_batches, False),
    "sft.steps": Reach(sft_optimizer),
    "sft.lr": Reach(sft_optimizer),
    "sft.num_demos": Reach(demonstrated_questions),
    "sft.wasted_search": Reach(sft_demonstrations),
    "sft.wrong_open": Reach(sft_demonstrations),
    "sft.single_states_facts": Reach(sft_demonstrations),
    "sft.report_fact_first": Reach(sft_demonstrations),
    "sft.modes": Reach(sft_demonstrations, "matpo+single"),
    "sft.worker_fraction": Reach(sft_worker_share, 0.5),
    "sft.context_lm_weight": Reach(sft_loss_weights),
    "sft.copy_weight": Reach(sft_loss_weights),
    "sft.batch_size": Reach(sft_batches, None, {"sft.copy_every": 2}),  # demos and rehearsal
    "sft.copy_steps": Reach(sft_batches),  # and the copy phase's loop (training_loops)
    "sft.copy_every": Reach(sft_batches),
    "sft.rehearsal": Reach(sft_batches, None, {"sft.copy_every": 2}),
    "sft.rehearsal_listings": Reach(rehearsal_tasks),
    "sft.copy_span": Reach(copy_phase),
    "sft.copy_shuffle": Reach(copy_phase),
    "sft.copy_lr": Reach(copy_phase, None, {"sft.copy_steps": 10}),
    "sft.init_checkpoint": Reach(shared_sft_start, "/runs/shared/checkpoints/sft"),
    "train.steps": Reach(rl_optimizer, None, {"rl.schedule": "cosine"}),  # and the loops
    "train.seed": Reach(built_model),  # and the loops' rngs
    **{f"train.{name}": Reach(training_loops) for name in (
        "log_every", "checkpoint_every", "keep_checkpoints", "async_checkpointing",
        "max_nonfinite_steps")},
    "train.eval_every": Reach(rl_evaluations),
    "train.remat": Reach(rl_step, "full"),
    "eval.datasets": Reach(evaluated_datasets, ("synthetic_multihop", "frames")),
    "eval.split": Reach(eval_questions, "test"),
    "eval.num_questions": Reach(eval_questions),
    "eval.temperature": Reach(eval_rollouts),
    "eval.curve_questions": Reach(curve_questions, 32),
}

def changed_value(path: str, reach: Reach):
    if reach.new is not None:
        return reach.new
    spec = schema()[path]
    default = spec.default
    if spec.kind is bool:
        return not default
    if spec.choices:
        return next(c for c in spec.choices if c != default)
    if spec.kind is int:
        return default + 1
    if spec.kind is float:
        return default * 0.5 if default else 0.5
    raise AssertionError(f"{path}: give the changed value in REACH")


def typed(overrides: dict):
    return to_typed(apply_overrides(base_config(), overrides), check_files=False)


def test_every_leaf_has_an_entry():
    missing = sorted(set(schema()) - set(REACH))
    stale = sorted(set(REACH) - set(schema()))
    assert not missing, f"config leaves that reach no consumer (add them to REACH): {missing}"
    assert not stale, f"REACH entries for fields that do not exist: {stale}"


@pytest.mark.parametrize("path", sorted(REACH))
def test_changing_the_field_changes_what_its_consumer_receives(path):
    reach = REACH[path]
    before = typed(reach.base)
    after = typed({**reach.base, path: changed_value(path, reach)})
    assert reach.probe(before) != reach.probe(after), (
        f"{path}: changing it did not change what {reach.probe.__name__} receives")


def _attribute_reads(source: str) -> set[str]:
    return set(re.findall(r"\.([a-z_][a-z0-9_]*)\b", source))


def test_the_rollout_engine_reads_every_field_of_its_section():
    """The engine receives the rollout section whole: each of its fields is read there (directly,
    or through a property of the section that the engine reads)."""
    engine_files = ("agents/rollout.py", "agents/rollout_metrics.py")
    reads = set().union(*(_attribute_reads((REPO / "matpo_jax" / f).read_text())
                          for f in engine_files))
    for name, member in vars(RolloutSection).items():
        if isinstance(member, property) and name in reads:
            reads |= set(re.findall(r"self\.([a-z_]+)", inspect.getsource(member.fget)))
    unread = [f.name for f in dataclasses.fields(RolloutSection) if f.name not in reads]
    assert not unread, f"rollout fields the engine never reads: {unread}"
