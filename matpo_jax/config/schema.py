"""Experiment configuration: every field with its default, validation that names the bad field, and
the glue between absl flags and config files.

An experiment is a file under configs/ defining `get_config(arg=None) -> ConfigDict` that starts
from `base_config()` and changes what it needs; `arg` is the string after the colon in
`--config=configs/X.py:mode=single,noise=0.5` (read it with `parse_arg`). Individual fields are
overridden with `--config.rl.lr=3e-4`. `validate_config` runs at start-up, before anything is
compiled, and reports every problem at once.
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
import math
import operator
import re
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

import ml_collections
from absl import flags
from ml_collections import config_dict, config_flags

from matpo_jax.parallel.mesh import MESH_AXES, MeshShapeError, resolve_mesh_shape


class ConfigError(ValueError):
    """An invalid experiment configuration; each problem in `problems` names its field."""

    def __init__(self, problems: str | Iterable[str]):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        if len(self.problems) == 1:
            message = self.problems[0]
        else:
            message = f"{len(self.problems)} config problems:\n  " + "\n  ".join(self.problems)
        super().__init__(message)


# ------------------------------------------------------------------------------------------ enums
# The value sets of the string-valued fields; the consumers (rl/, agents/) check the same sets.
CHOICES: dict[str, tuple[str, ...]] = {
    "model.dtype": ("float32", "bfloat16"),
    "model.param_dtype": ("float32", "bfloat16"),
    "data.name": ("synthetic_multihop", "musique", "frames", "webwalkerqa", "gaia_text"),
    "rollout.mode": ("matpo", "single"),
    "data.fact_style": ("varied", "plain"),
    "rollout.malformed_tool_call": ("error_message", "end_rollout"),
    "tools.search_backend": ("local", "serper", "retrieval"),
    "reward.method": ("exact", "f1", "judge"),
    "rl.schedule": ("constant", "cosine", "linear"),
    "rl.loss_agg": ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                    "seq-mean-token-sum-norm", "matpo"),
    "rl.seq_mean_denominator": ("sequences", "planners"),
    "rl.group_by": ("planner", "role"),
    "rl.kl_type": ("k1", "low_var_kl"),
    "eval.datasets": ("synthetic_multihop", "musique", "frames", "webwalkerqa", "gaia_text"),
}


def base_config() -> ml_collections.ConfigDict:
    """Every field an experiment can set, with defaults that run a small MATPO job on a CPU.

    Fields that default to None are optional and typed (`placeholder`), so `--config.x=...` works.
    """
    optional_str = lambda: config_dict.placeholder(str)  # noqa: E731
    c = ml_collections.ConfigDict()

    # Qwen3-shaped decoder. With `hf_checkpoint` set, its config.json wins over `arch`.
    c.model = ml_collections.ConfigDict()
    c.model.hf_checkpoint = optional_str()  # directory with config.json + *.safetensors
    c.model.tokenizer = optional_str()  # HF tokenizer dir; None: hf_checkpoint or the trained one
    c.model.dtype = "float32"  # activations
    c.model.param_dtype = "float32"  # parameters and optimizer state
    c.model.arch = ml_collections.ConfigDict(dict(  # names match model.config.Qwen3Config
        vocab_size=2048,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
    ))

    # Device mesh; one axis may be -1 to take the remaining devices. Batch is split over data*fsdp.
    c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, tensor=1))

    c.data = ml_collections.ConfigDict()
    c.data.name = "synthetic_multihop"
    c.data.split = "train"
    c.data.data_dir = optional_str()  # TFDS data_dir; None: <workdir>/tfds
    c.data.manual_dir = optional_str()  # downloaded MuSiQue/FRAMES/... files
    c.data.batch_size = 4  # questions per RL step (each sampled group_size times)
    c.data.shuffle_seed = 0
    c.data.world_seed = 0  # synthetic world: which world to generate
    c.data.fact_style = "varied"  # synthetic world: "plain" states every fact one way (easier)
    c.data.noise = 0.3  # synthetic world: share of distractor sentences/near-duplicates per page
    c.data.num_entities = 300  # synthetic world size (entities; pages follow)
    c.data.num_questions = 4000  # synthetic questions over all splits and hop counts
    c.data.max_hops = 4  # synthetic questions have 1..max_hops hops
    # synthetic world: > 0 gives SFT demonstrations their own entities (an `sft` split taken from
    # train), so RL rewards come from reading, never from facts SFT made the model memorise
    c.data.sft_fraction = 0.0
    # RL draws only train questions SFT did not demonstrate: their answers were never SFT targets
    # (entities are shared, so facts seen in SFT contexts can still be recalled)
    c.data.rl_skips_demonstrated = False
    # synthetic world: > 0 builds names from a shared lexicon of that many pseudo-words, so every
    # word of a held-out entity's name also occurs in train names (a new combination, not a new
    # token a small model never learned to emit); 0 draws fresh words per name
    c.data.name_words = 0

    c.rollout = ml_collections.ConfigDict()
    c.rollout.mode = "matpo"  # matpo: planner + workers; single: one agent with the tools
    c.rollout.group_size = 4  # G samples per question (the GRPO group)
    c.rollout.temperature = 1.0
    c.rollout.top_p = 1.0
    c.rollout.top_k = 0  # 0: off
    c.rollout.max_turns_planner = 6  # also the single agent's turn cap
    c.rollout.max_turns_worker = 6
    c.rollout.max_context = 2048  # tokens per rollout (prompt + everything after it)
    c.rollout.max_new_tokens_per_turn = 256
    c.rollout.max_worker_calls_per_turn = 1  # subagent calls one planner turn may make
    c.rollout.decode_slots = 32  # concurrent sequences in the decode batch
    # Compute each role's system turn (and each question's prompt, shared by its G samples) once
    # per rollout batch and start the slots that hold it from that cache. Off: prefill in full.
    c.rollout.reuse_prefixes = True
    # Tool calls run in the background while the batch decodes on (their agents give up their
    # slots until the results are back). For remote tools with real latency; with the local
    # search server (~1 ms a call) waiting is cheaper than the extra re-admissions.
    c.rollout.async_tools = False
    c.rollout.report_max_chars = 1000  # worker report handed to the planner is cut here
    c.rollout.final_summary = True  # give a stopped worker one no-tools turn to write its report
    c.rollout.final_summary_max_tokens = 256  # at most max_new_tokens_per_turn (the turn buffer)
    c.rollout.user_query_recap = True  # the worker also sees the planner's question
    c.rollout.malformed_tool_call = "error_message"  # or end_rollout (the reference behaviour)

    c.tools = ml_collections.ConfigDict()
    c.tools.search_backend = "local"  # local: our BM25 server over the synthetic corpus
    c.tools.search_url = optional_str()  # serper / retrieval endpoint; local: started by us
    c.tools.page_url = optional_str()  # page reader endpoint; local: started by us
    c.tools.api_key_env = "SERPER_API_KEY"  # env var holding the search API key (never the key)
    c.tools.num_results = 5
    c.tools.timeout_s = 30.0
    c.tools.retries = 2  # extra attempts after the first
    c.tools.max_response_chars = 2000  # tool output is cut here before entering the context

    # Accuracy (exact match, token F1 >= threshold, or an LLM judge) + tool-call format reward.
    c.reward = ml_collections.ConfigDict()
    c.reward.method = "exact"
    c.reward.f1_threshold = 0.8
    c.reward.judge_url = optional_str()  # OpenAI-compatible base URL, ends before /chat/...
    c.reward.judge_model = "gpt-4o-mini"
    c.reward.judge_api_key_env = "OPENAI_API_KEY"

    c.rl = ml_collections.ConfigDict()
    c.rl.lr = 1e-5
    c.rl.weight_decay = 0.01
    c.rl.grad_clip = 1.0  # global norm; 0: off
    c.rl.schedule = "constant"
    c.rl.warmup_steps = 0
    c.rl.adam_b1 = 0.9
    c.rl.adam_b2 = 0.999
    c.rl.eps_low = 0.2  # ratio clip range [1 - eps_low, 1 + eps_high]
    c.rl.eps_high = 0.2
    c.rl.dual_clip_c = 3.0  # bound on the loss of negative-advantage tokens
    c.rl.loss_agg = "token-mean"
    c.rl.seq_mean_denominator = "sequences"  # seq-mean modes; "planners" = reference release
    c.rl.loss_agg_norm = 0.0  # seq-mean-token-sum-norm divisor; 0: padded row length
    c.rl.norm_by_std = True  # False: Dr.GRPO advantages r - mean
    c.rl.group_by = "planner"  # or "role" (workers grouped on their own, ablation)
    c.rl.kl_coef = 0.0
    c.rl.kl_type = "low_var_kl"
    c.rl.entropy_coef = 0.0
    c.rl.ppo_mini_batches = 1  # optimizer steps per pass over the RL batch
    c.rl.ppo_epochs = 1  # passes over the RL batch
    c.rl.micro_batches = 1  # gradient-accumulation chunks per optimizer step
    c.rl.pack_rows = 8  # rows of one packed micro-batch (a fixed shape: one compile)
    c.rl.pack_len = 2048  # tokens per packed row; a whole rollout must fit in one row

    # Supervised warm start on scripted demonstrations of both roles, before RL.
    c.sft = ml_collections.ConfigDict()
    c.sft.steps = 200
    c.sft.lr = 1e-3
    c.sft.batch_size = 8  # packed rows per step
    c.sft.num_demos = 512
    c.sft.modes = ""  # demonstrated ways of working, e.g. "matpo+single"; "": rollout.mode
    # Start from another run's SFT checkpoints (its <workdir>/checkpoints/sft) instead of training:
    # RL runs of different methods/seeds then share one SFT starting point.
    c.sft.init_checkpoint = optional_str()
    c.sft.wasted_search = 0.1  # oracle detours per hop: an off-target search first
    c.sft.wrong_open = 0.1  # oracle detours per hop: open a wrong result first
    # Copy pre-training (copy_pretraining.py): steps of "span, separator, same span" rows cut from
    # the world's corpus, loss on the repeat only, run before SFT step 0 with its own optimizer
    # (same lr/schedule shape, fresh Adam state for SFT). 0 = off.
    c.sft.copy_steps = 0
    c.sft.copy_span = 64  # tokens per copied span (a sequence is 2 * copy_span + 1 tokens)
    c.sft.copy_shuffle = False  # permute each span's tokens: only copying predicts the repeat
    c.sft.copy_lr = 0.0  # peak lr of the copy phase; 0: sft.lr
    c.sft.copy_every = 0  # every n-th SFT step trains on a copy batch instead (rehearsal); 0: off
    # Loss weight of trainable SFT tokens that copy a span of the context (tool-call arguments,
    # answers, reported facts) relative to the other trainable tokens; the loss is renormalised
    # so it stays a weighted mean. 1.0 = plain cross-entropy.
    c.sft.copy_weight = 1.0
    # Language-modelling loss on the demonstrations' context tokens (tool responses, user turns),
    # relative to a trainable token's weight: grows a from-scratch model's copy (induction) heads.
    c.sft.context_lm_weight = 0.0

    c.train = ml_collections.ConfigDict()
    c.train.steps = 100  # RL steps
    c.train.seed = 0
    c.train.log_every = 1
    c.train.eval_every = 25  # 0: never
    c.train.checkpoint_every = 25  # 0: only at the end
    c.train.keep_checkpoints = 3
    c.train.async_checkpointing = True
    # Consecutive steps whose update was skipped (non-finite loss, gradient or parameters) after
    # which a phase stops, naming the step and the last good checkpoint; 0: never stop.
    c.train.max_nonfinite_steps = 3

    c.eval = ml_collections.ConfigDict()
    c.eval.datasets = ("synthetic_multihop",)
    c.eval.split = "validation"
    c.eval.num_questions = 64  # 0: the whole split
    c.eval.temperature = 0.0  # greedy
    return c


# ------------------------------------------------------------------------------------ value ranges
@dataclasses.dataclass(frozen=True)
class Interval:
    """Allowed numeric range; None ends are open."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def violation(self, value: float) -> str | None:
        if isinstance(value, float) and math.isnan(value):
            return "must be a number, got nan"
        for bound, holds, symbol in ((self.ge, operator.ge, ">="), (self.gt, operator.gt, ">"),
                                     (self.le, operator.le, "<="), (self.lt, operator.lt, "<")):
            if bound is not None and not holds(value, bound):
                return f"must be {symbol} {bound:g}"
        return None


POSITIVE = Interval(gt=0)
AT_LEAST_ONE = Interval(ge=1)
NON_NEGATIVE = Interval(ge=0)
UNIT = Interval(ge=0, le=1)

RANGES: dict[str, Interval] = {
    **{f"model.arch.{name}": AT_LEAST_ONE for name in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings")},
    "model.arch.rope_theta": POSITIVE,
    "model.arch.rms_norm_eps": POSITIVE,
    "data.batch_size": AT_LEAST_ONE,
    "data.noise": UNIT,
    "data.sft_fraction": Interval(ge=0, lt=0.7),  # a share of the 0.7 train share of entities
    "data.name_words": NON_NEGATIVE,
    "rollout.group_size": AT_LEAST_ONE,
    "rollout.temperature": NON_NEGATIVE,
    "rollout.top_p": Interval(gt=0, le=1),
    "rollout.top_k": NON_NEGATIVE,
    "rollout.max_turns_planner": AT_LEAST_ONE,
    "rollout.max_turns_worker": AT_LEAST_ONE,
    "rollout.max_context": AT_LEAST_ONE,
    "rollout.max_new_tokens_per_turn": AT_LEAST_ONE,
    "rollout.max_worker_calls_per_turn": AT_LEAST_ONE,
    "rollout.decode_slots": AT_LEAST_ONE,
    "rollout.report_max_chars": AT_LEAST_ONE,
    "rollout.final_summary_max_tokens": AT_LEAST_ONE,
    "tools.num_results": AT_LEAST_ONE,
    "tools.timeout_s": POSITIVE,
    "tools.retries": NON_NEGATIVE,
    "tools.max_response_chars": AT_LEAST_ONE,
    "reward.f1_threshold": UNIT,
    "rl.lr": POSITIVE,
    "rl.weight_decay": NON_NEGATIVE,
    "rl.grad_clip": NON_NEGATIVE,
    "rl.warmup_steps": NON_NEGATIVE,
    "rl.adam_b1": Interval(ge=0, lt=1),
    "rl.adam_b2": Interval(ge=0, lt=1),
    "rl.eps_low": Interval(ge=0, lt=1),  # 1 - eps_low must stay a positive ratio
    "rl.eps_high": NON_NEGATIVE,
    "rl.dual_clip_c": Interval(gt=1),  # c <= 1 would clip below the ordinary clip
    "rl.loss_agg_norm": NON_NEGATIVE,
    "rl.kl_coef": NON_NEGATIVE,
    "rl.entropy_coef": NON_NEGATIVE,
    "rl.ppo_mini_batches": AT_LEAST_ONE,
    "rl.ppo_epochs": AT_LEAST_ONE,
    "rl.micro_batches": AT_LEAST_ONE,
    "rl.pack_rows": AT_LEAST_ONE,
    "rl.pack_len": AT_LEAST_ONE,
    "sft.steps": NON_NEGATIVE,
    "sft.lr": POSITIVE,
    "sft.batch_size": AT_LEAST_ONE,
    "sft.num_demos": NON_NEGATIVE,
    "sft.copy_steps": NON_NEGATIVE,
    "sft.copy_span": AT_LEAST_ONE,
    "sft.copy_lr": NON_NEGATIVE,
    "sft.copy_every": NON_NEGATIVE,
    "sft.copy_weight": POSITIVE,
    "sft.context_lm_weight": NON_NEGATIVE,
    "train.steps": NON_NEGATIVE,
    "train.log_every": AT_LEAST_ONE,
    "train.eval_every": NON_NEGATIVE,
    "train.checkpoint_every": NON_NEGATIVE,
    "train.keep_checkpoints": AT_LEAST_ONE,
    "train.max_nonfinite_steps": NON_NEGATIVE,
    "eval.num_questions": NON_NEGATIVE,
    "eval.temperature": NON_NEGATIVE,
}

# -------------------------------------------------------------------------------------- validation
def validate_config(cfg: ml_collections.ConfigDict, num_devices: int | None = None, *,
                    check_files: bool = True) -> ml_collections.ConfigDict:
    """Checks `cfg` against the schema of `base_config()` and returns it unchanged.

    Raises ConfigError listing every problem, each naming its field: unknown or missing fields,
    wrong types, values out of range, invalid choices, a mesh that does not match `num_devices`
    (skipped when None, e.g. validating a pod config on a laptop), and a missing checkpoint or
    tokenizer directory (skipped with check_files=False).
    """
    schema = _schema(base_config())
    values = _flatten(cfg)
    problems = [_unknown_field_message(path, schema) for path in values if path not in schema]
    problems += [f"missing field {path}" for path in schema if path not in values]
    for path, value in values.items():
        if path in schema:
            problems += _value_problems(path, value, schema[path])
    if not problems:  # the cross-field checks below assume every field is present and typed
        problems += _consistency_problems(cfg, num_devices, check_files)
    if problems:
        raise ConfigError(problems)
    return cfg


@dataclasses.dataclass(frozen=True)
class _FieldSpec:
    type: type
    optional: bool  # None is allowed


def _schema(base: ml_collections.ConfigDict) -> dict[str, _FieldSpec]:
    spec = {}
    for path, value in _flatten(base).items():
        if value is None:  # a placeholder: its declared type lives on the reference
            parent, _, name = path.rpartition(".")
            group = base if not parent else _lookup(base, parent)
            spec[path] = _FieldSpec(group.get_ref(name).get_type(), optional=True)
        else:
            spec[path] = _FieldSpec(tuple if isinstance(value, (tuple, list)) else type(value),
                                    optional=False)
    return spec


def _flatten(tree, prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, (Mapping, ml_collections.ConfigDict, config_dict.FrozenConfigDict)):
            out.update(_flatten(value, path + "."))
        else:
            out[path] = value
    return out


def _lookup(cfg, path: str):
    for name in path.split("."):
        cfg = cfg[name]
    return cfg


def _unknown_field_message(path: str, schema: Mapping[str, Any]) -> str:
    # Prefer a sibling (rl.lrr -> rl.lr), then any field (lr -> rl.lr).
    parent = path.rpartition(".")[0]
    siblings = [p for p in schema if p.rpartition(".")[0] == parent]
    match = (difflib.get_close_matches(path, siblings, n=1, cutoff=0.6)
             or difflib.get_close_matches(path, list(schema), n=1, cutoff=0.6))
    hint = f" (did you mean {match[0]}?)" if match else ""
    return f"unknown field {path}{hint}"


def _type_name(t: type) -> str:
    return "tuple" if t is tuple else t.__name__


def _value_problems(path: str, value: Any, spec: _FieldSpec) -> list[str]:
    if value is None:
        return [] if spec.optional else [f"{path} is None: expected {_type_name(spec.type)}"]
    is_int = isinstance(value, int) and not isinstance(value, bool)
    ok = {int: is_int, float: is_int or isinstance(value, float), bool: isinstance(value, bool),
          str: isinstance(value, str), tuple: isinstance(value, (tuple, list))}.get(
              spec.type, isinstance(value, spec.type))
    if not ok:
        return [f"{path} = {value!r}: expected {_type_name(spec.type)}, "
                f"got {type(value).__name__}"]
    problems = []
    if path in CHOICES:
        allowed = CHOICES[path]
        for item in value if spec.type is tuple else (value,):
            if item not in allowed:
                problems.append(f"{path} = {item!r}: must be one of {', '.join(allowed)}")
    if path in RANGES and (violation := RANGES[path].violation(value)):
        problems.append(f"{path} = {value!r}: {violation}")
    return problems


def sft_modes(cfg) -> tuple[str, ...]:
    """The ways of working SFT demonstrates: `sft.modes` ("matpo+single"), or the rollout mode."""
    return tuple(m.strip() for m in str(cfg.sft.modes or cfg.rollout.mode).split("+") if m.strip())


def _consistency_problems(cfg, num_devices: int | None, check_files: bool) -> list[str]:
    problems = []
    for axis in MESH_AXES:
        if cfg.mesh[axis] != -1 and cfg.mesh[axis] < 1:
            problems.append(f"mesh.{axis} = {cfg.mesh[axis]}: must be >= 1 or -1 (the rest)")
    if not problems and num_devices is not None:
        try:
            sizes = resolve_mesh_shape(cfg.mesh, num_devices)
            batch_shards = sizes["data"] * sizes["fsdp"]
            if cfg.rl.pack_rows % batch_shards:
                problems.append(f"rl.pack_rows = {cfg.rl.pack_rows}: must be a multiple of "
                                f"mesh.data*mesh.fsdp = {batch_shards} (rows are split over them)")
        except MeshShapeError as e:
            problems.append(str(e))

    arch = cfg.model.arch
    if arch.num_attention_heads % arch.num_key_value_heads:
        problems.append(f"model.arch.num_attention_heads = {arch.num_attention_heads}: must be a "
                        f"multiple of model.arch.num_key_value_heads = {arch.num_key_value_heads}")
    ro = cfg.rollout
    for name in ("max_new_tokens_per_turn", "final_summary_max_tokens"):
        if ro[name] > ro.max_context:
            problems.append(f"rollout.{name} = {ro[name]}: exceeds rollout.max_context = "
                            f"{ro.max_context}")
    if cfg.rl.pack_len < ro.max_context:
        problems.append(f"rl.pack_len = {cfg.rl.pack_len}: must be >= rollout.max_context = "
                        f"{ro.max_context} so every rollout fits in one packed row")
    if cfg.reward.method == "judge" and not cfg.reward.judge_url:
        problems.append("reward.judge_url must be set when reward.method = 'judge'")
    if cfg.tools.search_backend != "local" and not cfg.tools.search_url:
        problems.append(f"tools.search_url must be set when tools.search_backend = "
                        f"{cfg.tools.search_backend!r}")
    for mode in sft_modes(cfg):
        if mode not in CHOICES["rollout.mode"]:
            problems.append(f"sft.modes = {cfg.sft.modes!r}: {mode!r} is not one of "
                            f"{', '.join(CHOICES['rollout.mode'])}")
    if check_files:
        problems += _missing_file_problems(cfg)
    return problems


def _missing_file_problems(cfg) -> list[str]:
    problems = []
    for path_field, required_file in (("model.hf_checkpoint", "config.json"),
                                      ("model.tokenizer", None), ("sft.init_checkpoint", None)):
        value = _lookup(cfg, path_field)
        if not value or "://" in value:  # unset, or remote storage we cannot stat from here
            continue
        directory = Path(value).expanduser()
        if not directory.is_dir():
            problems.append(f"{path_field} = {value!r}: directory does not exist")
        elif required_file and not (directory / required_file).is_file():
            problems.append(f"{path_field} = {value!r}: no {required_file} in that directory")
    return problems


# --------------------------------------------------------------------------- config-file arguments
def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
    """Parses the `get_config` argument "mode=matpo,noise=0.5" into a ConfigDict.

    Every key must be one of `defaults`; values are converted to the default's type. A bare key
    sets a bool to True ("final_summary" == "final_summary=true").
    """
    out = ml_collections.ConfigDict(defaults)
    for item in filter(None, (part.strip() for part in (arg or "").split(","))):
        key, has_value, text = (part.strip() for part in item.partition("="))
        if key not in defaults:
            raise ConfigError(f"unknown config argument {key!r}; known: {', '.join(defaults)}")
        default = defaults[key]
        if not has_value and not isinstance(default, bool):
            raise ConfigError(f"config argument {key!r} needs a value ({key}=...)")
        out[key] = _convert(key, text if has_value else "true", default)
    return out


def apply_overrides(cfg: ml_collections.ConfigDict, overrides: str | Mapping[str, Any] | None):
    """Sets dotted fields ("rollout.mode=single,rl.lr=3e-4"); strings are typed like the field."""
    if isinstance(overrides, str) or overrides is None:
        pairs = [item.partition("=") for item in (overrides or "").split(",") if item.strip()]
        overrides = {key.strip(): value.strip() for key, _, value in pairs}
    schema = _flatten(cfg)
    for path, value in overrides.items():
        if path not in schema:
            raise ConfigError(_unknown_field_message(path, schema))
        parent, _, name = path.rpartition(".")
        group = _lookup(cfg, parent) if parent else cfg
        current = schema[path]
        if isinstance(value, str) and not isinstance(current, str):
            if current is None:
                current = group.get_ref(name).get_type()()
            value = _convert(path, value, current)
        group[name] = value
    return cfg


def _convert(name: str, text: str, like: Any):
    try:
        if isinstance(like, bool):
            lowered = text.lower()
            if lowered not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(text)
            return lowered in ("true", "1", "yes")
        if isinstance(like, (tuple, list)):
            return tuple(part for part in text.split("+") if part)  # "a+b": commas split args
        return type(like)(text)
    except ValueError:
        raise ConfigError(f"{name} = {text!r}: expected {type(like).__name__}") from None


# ---------------------------------------------------------------------------- files and the flags
def load_config_file(path: str | Path, arg: str | None = None) -> ml_collections.ConfigDict:
    """Imports a config file by path and returns `get_config(arg)` (as config_flags does)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    spec = importlib.util.spec_from_file_location(f"_matpo_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise ConfigError(f"config file {path} defines no get_config()")
    return module.get_config(arg) if arg is not None else module.get_config()


def save_config(cfg: ml_collections.ConfigDict, workdir: str | Path) -> Path:
    """Writes the resolved config to <workdir>/config.json, the run's record of what it ran."""
    path = Path(workdir) / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg.to_dict(), indent=2, sort_keys=True, default=str) + "\n")
    return path


def define_flags(config_flag: str = "config", flag_values: flags.FlagValues = flags.FLAGS,
                 sys_argv: list[str] | None = None):
    """Defines --config (a config file, overridable per field) and --workdir; returns the holders.

    ml_collections finds the --config.a.b overrides in `sys_argv` (default: sys.argv at parse
    time), not in the argv handed to the parser; tests pass the same list to both."""
    config = config_flags.DEFINE_config_file(
        config_flag, None, "Experiment config file, e.g. configs/base.py[:arg].",
        flag_values=flag_values, lock_config=True, sys_argv=sys_argv)
    workdir = flags.DEFINE_string("workdir", None, "Run directory: checkpoints, metrics, plots.",
                                  flag_values=flag_values)
    return config, workdir


def parse_flags(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS,
                config_flag: str = "config") -> list[str]:
    """Parses argv like absl does, turning a bad --config override into a ConfigError that names
    the field (ml_collections raises a bare KeyError/AttributeError traceback for those)."""
    try:
        return flag_values(argv)
    except Exception as error:  # noqa: BLE001 -- re-raised with the field named
        schema = _schema(base_config())
        groups = {p.rsplit(".", i)[0] for p in schema for i in range(1, p.count(".") + 1)}
        pattern = re.compile(rf"^--?{re.escape(config_flag)}\.([\w.]+)(=|$)")
        unknown = [
            _unknown_field_message(m.group(1), schema) for arg in argv[1:]
            if (m := pattern.match(arg)) and m.group(1) not in schema and m.group(1) not in groups
        ]
        raise ConfigError(unknown or [f"command line: {error}"]) from error


def flags_parser(argv: list[str]) -> list[str]:
    """`app.run(main, flags_parser=flags_parser)`: a bad override exits with one clear line."""
    try:
        return parse_flags(argv)
    except ConfigError as error:
        print(f"FATAL config error: {error}", file=sys.stderr)
        sys.exit(2)


def config_from_flags(config_holder, num_devices: int | None = None, *,
                      check_files: bool = True) -> ml_collections.ConfigDict:
    """The parsed --config, validated (and the -1 mesh axis left for `resolve_mesh_shape`)."""
    cfg = config_holder.value
    if cfg is None:
        raise ConfigError("--config is required (e.g. --config=configs/base.py)")
    return validate_config(cfg, num_devices, check_files=check_files)
