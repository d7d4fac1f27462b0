"""A run's training checkpoint -> a Hugging Face directory that transformers loads and generates from.

    export_checkpoint("<workdir>/checkpoints/rl", "out/")         # newest step
    -> out/config.json, model.safetensors, generation_config.json, tokenizer.json,
       tokenizer_config.json (+ chat template file when the tokenizer has one), export.json

The architecture and the tokenizer come from the run's own record, <workdir>/config.json: the
Hugging Face checkpoint the run started from (`model.hf_checkpoint`; its tokenizer, or
`model.tokenizer`), or the tiny `model.arch` and the tokenizer trained on the synthetic world. Only
the parameters are read from the training checkpoint (`restore_params`), never the optimizer state.
The checkpoint's recorded identity (run/provenance.py) must match that config.json and tokenizer;
`out` must be a directory the export owns (run/output_dir.py); export.json records the files
written and the checkpoint, step and hashes they come from.

A LoRA run (model.lora.rank > 0; its checkpoints hold the adapters alone) is restored over its
base (model.hf_checkpoint, or model.arch built from train.seed), whose hash must be the one the
checkpoint records (provenance.check_base). Shared adapter: `out` holds the merged weights (a
drop-in model, as for full fine-tuning) and `out/adapter/` the adapter in PEFT's format.
Per-role adapters: `out` holds the base weights and `out/adapters/planner`, `out/adapters/worker`
two PEFT adapters of that base (docs/lora.md).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from typing import Any

import jax
from flax import nnx

from matpo_jax.report import files

from matpo_jax.chat import ChatFormat
from matpo_jax.data import world_assets
from matpo_jax.model import DecoderConfig, CausalLM, load_pretrained
from matpo_jax.model import lora as lora_lib
from matpo_jax.model import peft_io
from matpo_jax.model.hf_io import load_config, save_params
from matpo_jax.run import output_dir, provenance

RUN_CONFIG_FILE = "config.json"
# Tokenizer files a Hugging Face directory may hold (copied as they are: the checkpoint's own
# layout, chat template included, stays intact).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "chat_template.jinja", "chat_template.json", "vocab.json",
                   "merges.txt")
GENERATION_CONFIG_FILE = "generation_config.json"
# What an export records about itself: the files it wrote (the only ones a later export into the
# same directory replaces) and the checkpoint, step and hashes they come from.
EXPORT_MANIFEST = "export.json"
log = logging.getLogger(__name__)


class ExportError(ValueError):
    """A checkpoint or run directory we cannot export (names the path or field)."""


@dataclasses.dataclass(frozen=True)
class Exported:
    out: str
    step: int
    config: DecoderConfig
    tokenizer_dir: str


class MissingField(ExportError, AttributeError):
    """A field the run's config.json does not have (an AttributeError, so getattr defaults work)."""


class _Fields:
    """Attribute access to the run's saved config (a JSON dict), as the library reads configs."""

    def __init__(self, values: dict, prefix: str = ""):
        self._values, self._prefix = values, prefix

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._values:
            raise MissingField(f"run config has no field {self._prefix}{name}")
        value = self._values[name]
        return _Fields(value, f"{self._prefix}{name}.") if isinstance(value, dict) else value

    def __iter__(self):
        return iter(self._values)

    def keys(self):
        return self._values.keys()

    def __getitem__(self, name):
        return self._values[name]

    def as_dict(self) -> dict:
        return self._values


def find_run_dir(checkpoint_dir: str) -> str:
    """The run's workdir: the nearest directory above `checkpoint_dir` (itself included) holding
    config.json (<workdir>/checkpoints/rl -> <workdir>)."""
    path = files.absolute(checkpoint_dir).rstrip("/") or "/"
    for _ in range(4):
        if files.run_path(path, RUN_CONFIG_FILE).is_file():
            return path
        path = os.path.dirname(path)
    raise ExportError(f"{checkpoint_dir}: no {RUN_CONFIG_FILE} in it or its parents; expected a "
                      f"run's checkpoint directory such as <workdir>/checkpoints/rl")


def load_run_config(workdir: str) -> _Fields:
    path = os.path.join(workdir, RUN_CONFIG_FILE)
    try:
        return _Fields(json.loads(files.run_path(path).read_text(encoding="utf-8")))
    except (OSError, json.JSONDecodeError) as err:
        raise ExportError(f"{path}: cannot read the run's config ({err})") from None


def model_config(run_cfg) -> DecoderConfig:
    """The architecture the run trained: its Hugging Face checkpoint's, else model.arch."""
    model = run_cfg.model
    if model.hf_checkpoint:
        return load_config(model.hf_checkpoint, dtype=model.dtype, param_dtype=model.param_dtype)
    return DecoderConfig(**dict(model.arch), dtype=model.dtype, param_dtype=model.param_dtype)


def restore_params(directory: str, abstract_params, step: int | None = None):
    """(step, parameters) of a training checkpoint, nothing else read from it: `step`, else the
    newest that restores (a damaged newer one is skipped with one warning naming it and left
    where it is: the run is not the export's to change).

    Works on both layouts a step directory may have: a `params` item (the parameter tree), or an
    item holding the whole train state with a `params` field (restored partially, by name).
    `abstract_params`: ShapeDtypeStructs (with shardings) of the nnx.Param state."""
    import orbax.checkpoint as ocp

    directory = files.absolute(directory)
    if not files.run_path(directory).is_dir():
        raise ExportError(f"checkpoint directory {directory} does not exist")
    steps = ocp.CheckpointManager(
        directory, options=ocp.CheckpointManagerOptions(read_only=True)).all_steps()
    if not steps:
        raise ExportError(f"{directory}: no finished checkpoint step")
    if step is not None:
        if int(step) not in steps:
            raise ExportError(f"{directory}: no step {step} (steps: {sorted(steps)})")
        try:
            return int(step), _restore_step(os.path.join(directory, str(step)), abstract_params)
        except ExportError:
            raise
        except Exception as error:  # noqa: BLE001 - any failure to read: one line
            raise ExportError(f"{directory}/{step} does not restore ({_first_line(error)})") \
                from None
    failed = []
    for candidate in sorted(steps, reverse=True):
        try:
            params = _restore_step(os.path.join(directory, str(candidate)), abstract_params)
        except Exception as error:  # noqa: BLE001 - any failure to read means: not valid
            failed.append((candidate, _first_line(error)))
            continue
        for bad, reason in failed:
            log.warning("checkpoint %s/%d is unreadable (%s); exporting step %d, the newest "
                        "that restores", directory, bad, reason, candidate)
        return candidate, params
    raise ExportError(f"no checkpoint in {directory} restores (newest, step {failed[0][0]}: "
                      f"{failed[0][1]})")


def _first_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:200]}"


def _restore_step(step_dir: str, abstract_params):
    import orbax.checkpoint as ocp

    items = sorted(p.name for p in files.run_path(step_dir).iterdir()
                   if p.is_dir() and not p.name.startswith("_"))
    checkpointer = ocp.PyTreeCheckpointer()
    restore_args = ocp.checkpoint_utils.construct_restore_args
    if "params" in items:
        return checkpointer.restore(os.path.join(step_dir, "params"), args=ocp.args.PyTreeRestore(
            item=abstract_params, restore_args=restore_args(abstract_params)))
    for item in items:
        try:
            tree = checkpointer.metadata(os.path.join(step_dir, item)).item_metadata.tree
        except Exception:  # noqa: BLE001  (not a pytree item, e.g. JSON metadata)
            continue
        if isinstance(tree, dict) and "params" in tree:
            target = {"params": abstract_params}
            restored = checkpointer.restore(os.path.join(step_dir, item), args=ocp.args.PyTreeRestore(
                item=target, restore_args=restore_args(target), partial_restore=True))
            return restored["params"]
    raise ExportError(f"{step_dir}: no 'params' item and no item with a 'params' field "
                      f"(items: {', '.join(items) or 'none'})")


def abstract_params(config: DecoderConfig, device: jax.Device | None = None):
    """ShapeDtypeStructs of the model's nnx.Param state, placed on one (host) device."""
    device = device or jax.devices("cpu")[0]
    model = nnx.eval_shape(lambda: CausalLM(config, rngs=nnx.Rngs(0)))
    sharding = jax.sharding.SingleDeviceSharding(device)
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                        nnx.state(model, nnx.Param))


def lora_config(run_cfg) -> lora_lib.LoRAConfig | None:
    """The run's adapters (None: full fine-tuning, or a config from before model.lora)."""
    lora = getattr(run_cfg.model, "lora", None)
    if lora is None or not lora.rank:
        return None
    return lora_lib.LoRAConfig(rank=lora.rank, alpha=lora.alpha, targets=tuple(lora.targets),
                               roles=lora.roles,  # base_dtype: None in runs from before it
                               base_dtype=lora.base_dtype if "base_dtype" in lora.keys() else None)


def restore_adapters(run_cfg, config: DecoderConfig, lora: lora_lib.LoRAConfig,
                     checkpoint: str, step: int | None):
    """(step, model): the run's base on the host, built as the run built it, with the adapters
    of `checkpoint` (step `step`, else the newest that restores)."""
    seed = run_cfg.train.seed
    with jax.default_device(jax.devices("cpu")[0]):
        if run_cfg.model.hf_checkpoint:
            model = load_pretrained(run_cfg.model.hf_checkpoint, dtype=config.dtype,
                                    param_dtype=config.param_dtype)
        else:
            model = CausalLM(config, rngs=nnx.Rngs(seed))
        lora_lib.add_adapters(model, lora, seed=seed)
    graphdef, adapters, base = lora_lib.split_trainable(model)
    sharding = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                            adapters)
    step, adapters = restore_params(checkpoint, abstract, step)
    return step, nnx.merge(graphdef, adapters, base)


def _save_lora(model, lora: lora_lib.LoRAConfig, run_cfg, stage: str, dtype, out: str) -> None:
    """Shared: merged weights + `adapter/`; per-role: base weights + `adapters/<role>`, whose
    base_model_name_or_path is `out` (where the staged files are published)."""
    if lora.roles == "shared":
        save_params(model.config, peft_io.merged_params(model), stage, dtype)
        peft_io.save_peft_adapters(model, os.path.join(stage, "adapter"),
                                   base_model=run_cfg.model.hf_checkpoint)
        return
    save_params(model.config, nnx.state(model, nnx.Param), stage, dtype)
    peft_io.save_peft_adapters(model, os.path.join(stage, "adapters"), base_model=out)


def export_checkpoint(checkpoint: str, out: str, step: int | None = None,
                      tokenizer: str | None = None, dtype: str | None = None) -> Exported:
    """Writes the parameters of `checkpoint` (newest step, or `step`) as a Hugging Face directory
    `out`, with the run's tokenizer (or `tokenizer`) and a generation config. `dtype`: the dtype of
    the saved weights (default: the run's model.param_dtype).

    The run config found above the checkpoint and the tokenizer must be the ones the checkpoint
    records (run/provenance.py); `out` must be new, empty, or an earlier export's
    (run/output_dir.py), and its export.json records what produced it."""
    workdir = find_run_dir(checkpoint)
    run_cfg = load_run_config(workdir)
    previous = output_dir.claim(out, EXPORT_MANIFEST, writer="export")  # before any work
    config = model_config(run_cfg)
    data_dir = run_cfg.data.data_dir or files.local_dir_for(workdir, "tfds")
    tokenizer_dir = tokenizer or world_assets.tokenizer_dir(run_cfg, data_dir)
    chat = ChatFormat.from_pretrained(tokenizer_dir)  # fails early, naming the directory
    if chat.id_count > config.vocab_size:
        raise ExportError(f"tokenizer {tokenizer_dir} uses ids up to {chat.id_count - 1}, beyond "
                          f"the model's vocab_size {config.vocab_size}")
    lora = lora_config(run_cfg)
    if lora is None:
        step, params = restore_params(checkpoint, abstract_params(config), step)
    else:
        step, model = restore_adapters(run_cfg, config, lora, checkpoint, step)
    step_dir = os.path.join(files.absolute(checkpoint), str(step))
    identity = provenance.read_identity(files.absolute(checkpoint), step)
    provenance.check_run_config(identity, run_cfg.as_dict(), checkpoint=step_dir,
                                config_path=os.path.join(workdir, RUN_CONFIG_FILE))
    provenance.check_tokenizer(identity, chat.tokenizer, checkpoint=step_dir,
                               source=f"tokenizer {tokenizer_dir}")
    if lora is not None:
        provenance.check_base(identity, provenance.base_identity(run_cfg.as_dict()),
                              checkpoint=step_dir)
    stage = output_dir.staging_dir(out)  # safetensors writes local files
    try:
        if lora is None:
            save_params(config, params, stage, dtype)
        else:
            _save_lora(model, lora, run_cfg, stage, dtype, files.absolute(out))
        _keep_source_config_fields(run_cfg, stage)
        for name in TOKENIZER_FILES:
            if os.path.isfile(os.path.join(tokenizer_dir, name)):
                shutil.copyfile(os.path.join(tokenizer_dir, name), os.path.join(stage, name))
        _write_generation_config(run_cfg, chat, stage)
        shipped = provenance.tokenizer_sha256(ChatFormat.from_pretrained(stage).tokenizer)
        if shipped != provenance.tokenizer_sha256(chat.tokenizer):  # what transformers will read
            raise ExportError(f"the exported tokenizer reads other ids than {tokenizer_dir}")
        written = sorted(os.listdir(stage))
        with open(os.path.join(stage, EXPORT_MANIFEST), "w", encoding="utf-8") as f:
            json.dump({"files": written, "step": step, "tokenizer_dir": tokenizer_dir,
                       "tokenizer_sha256": shipped, "dtype": dtype or config.param_dtype,
                       "source": provenance.source_identity(checkpoint, step, identity)},
                      f, indent=1, sort_keys=True)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    output_dir.publish(stage, out, previous, EXPORT_MANIFEST)
    return Exported(out=out, step=step, config=config, tokenizer_dir=tokenizer_dir)


def _keep_source_config_fields(run_cfg, out: str) -> None:
    """config.json keeps every field of the starting checkpoint's that the export does not write
    (Qwen3's bos/eos_token_id, max_window_layers, use_cache, ...); the written ones win, and an
    older `torch_dtype` follows the written `dtype`."""
    source = run_cfg.model.hf_checkpoint
    source_file = os.path.join(source, RUN_CONFIG_FILE) if source else None
    if not source_file or not os.path.isfile(source_file):
        return
    with open(source_file, encoding="utf-8") as f:
        try:
            kept = json.load(f)
        except ValueError as error:
            raise ExportError(f"{source_file}: not JSON ({error})") from None
    written_file = os.path.join(out, RUN_CONFIG_FILE)
    with open(written_file, encoding="utf-8") as f:
        written = json.load(f)
    merged = {**kept, **written}
    if "torch_dtype" in kept:
        merged["torch_dtype"] = written["dtype"]
    with open(written_file, "w", encoding="utf-8") as f:
        json.dump(merged, f, indent=2)


def _write_generation_config(run_cfg, chat: ChatFormat, out: str) -> None:
    """The starting checkpoint's generation config when it has one; else greedy-neutral defaults
    that stop where our sampler stops (<|im_end|>, <|endoftext|>)."""
    source = run_cfg.model.hf_checkpoint
    if source and os.path.isfile(os.path.join(source, GENERATION_CONFIG_FILE)):
        shutil.copyfile(os.path.join(source, GENERATION_CONFIG_FILE),
                        os.path.join(out, GENERATION_CONFIG_FILE))
        return
    with open(os.path.join(out, GENERATION_CONFIG_FILE), "w") as f:
        json.dump({"eos_token_id": list(chat.stop_ids), "pad_token_id": chat.pad_id,
                   "bos_token_id": None}, f, indent=2)
