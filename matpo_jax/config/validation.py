"""From the ConfigDict a config file built to a validated `ExperimentConfig`: every problem found
at once, one line each naming its field, before anything is compiled or written.

Checks, in order: unknown and missing fields, each field's type / range / choices (non-finite
numbers refused everywhere), each section's own rules and the rules between sections (declared
with the sections, sections.py), then the config against the machine: the mesh against the device
count (when known) and the directories the config names (when asked).
"""
from __future__ import annotations

import dataclasses
import hashlib
import typing
from pathlib import Path
from typing import Any

from matpo_jax.config.configdict import flatten, schema, unknown_field_message
from matpo_jax.config.errors import ConfigError
from matpo_jax.config.fields import Section, is_section
from matpo_jax.config.sections import SECTIONS, ExperimentConfig


def to_typed(cfg, num_devices: int | None = None, *, check_files: bool = True) -> ExperimentConfig:
    """The validated, typed config of a ConfigDict (or nested mapping / ExperimentConfig).

    Raises ConfigError listing every problem, each naming its field: unknown or missing fields,
    wrong types, values out of range or not finite, invalid choices, broken rules between fields,
    a mesh that does not match `num_devices` (skipped when None, e.g. validating a pod config on a
    laptop), and a missing checkpoint or tokenizer directory (skipped with check_files=False).
    """
    values = flatten(cfg)
    specs = schema()
    problems = [unknown_field_message(path) for path in values if path not in specs]
    problems += [f"missing field {path}" for path in specs if path not in values]
    for path, value in values.items():
        if path in specs:
            problems += specs[path].problems(value)
    if problems:
        raise ConfigError(problems)
    typed = ExperimentConfig.unchecked({name: _unchecked(section, name, values)
                                        for name, section in SECTIONS.items()})
    problems = [p for section in _all_sections(typed) for p in section.consistency_problems()]
    problems += typed.consistency_problems()
    if num_devices is not None and not any(p.startswith("mesh") for p in problems):
        problems += _mesh_problems(typed, num_devices)
    if check_files:
        problems += _missing_directories(typed) or _checksum_problems(typed)
    if problems:
        raise ConfigError(problems)
    return typed


def validate_config(cfg, num_devices: int | None = None, *, check_files: bool = True):
    """Checks `cfg` (see `to_typed`) and returns it unchanged."""
    to_typed(cfg, num_devices, check_files=check_files)
    return cfg


def _unchecked(cls: type[Section], prefix: str, values: dict[str, Any]) -> Section:
    hints = typing.get_type_hints(cls)
    fields = {}
    for f in dataclasses.fields(cls):
        path = f"{prefix}.{f.name}"
        fields[f.name] = (_unchecked(hints[f.name], path, values)
                          if is_section(hints[f.name])
                          else values[path])
    return cls.unchecked(fields)


def _all_sections(cfg: ExperimentConfig):
    for name in SECTIONS:
        section = getattr(cfg, name)
        yield section
        if name == "model":
            yield section.arch


def _mesh_problems(cfg: ExperimentConfig, num_devices: int) -> list[str]:
    from matpo_jax.parallel.mesh import MeshShapeError, resolve_mesh_shape  # imports jax

    try:
        sizes = resolve_mesh_shape(cfg.mesh.axes(), num_devices)
    except MeshShapeError as e:
        return [str(e)]
    batch_shards = sizes["data"] * sizes["fsdp"]
    if cfg.rl.pack_rows % batch_shards:
        return [f"rl.pack_rows = {cfg.rl.pack_rows}: must be a multiple of mesh.data*mesh.fsdp = "
                f"{batch_shards} (rows are split over them)"]
    split = cfg.rl.micro_batches * cfg.rl.ppo_mini_batches * batch_shards
    if split > cfg.rl.pack_rows:  # each micro-batch needs a row on every data shard
        return [f"rl.micro_batches = {cfg.rl.micro_batches}: rl.micro_batches x "
                f"rl.ppo_mini_batches x mesh.data*mesh.fsdp = {split} must be <= rl.pack_rows = "
                f"{cfg.rl.pack_rows}"]
    return []


def _missing_directories(cfg: ExperimentConfig) -> list[str]:
    problems = []
    for path_field, value, required_file in (
            ("model.hf_checkpoint", cfg.model.hf_checkpoint, "config.json"),
            ("model.tokenizer", cfg.model.tokenizer, None),
            ("sft.init_checkpoint", cfg.sft.init_checkpoint, None)):
        if not value or "://" in value:  # unset, or remote storage we cannot stat from here
            continue
        directory = Path(value).expanduser()
        if not directory.is_dir():
            problems.append(f"{path_field} = {value!r}: directory does not exist")
        elif required_file and not (directory / required_file).is_file():
            problems.append(f"{path_field} = {value!r}: no {required_file} in that directory")
    return problems



def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _checksum_problems(cfg: ExperimentConfig) -> list[str]:
    """A checkpoint named with its sha256 (the committed warm start) must be those bytes: a
    partial download, a stale rebuild or an edited file would silently change every result."""
    expected, directory = cfg.model.hf_checkpoint_sha256, cfg.model.hf_checkpoint
    if not expected or not directory or "://" in directory:
        return []
    weights = Path(directory).expanduser() / "model.safetensors"
    if not weights.is_file():
        return [f"model.hf_checkpoint_sha256: no {weights} to check"]
    actual = file_sha256(weights)
    if actual != expected.lower():
        # Never offer to adopt the file's hash: a broken rebuild would become the pinned model.
        return [f"model.hf_checkpoint_sha256 = {expected!r}: {weights} has sha256 {actual!r}, "
                f"not the weights this config was made with (replaced or damaged); restore them "
                f"(a committed warm start: git checkout -- {directory})"]
    return []
