"""The ml_collections view of the config that config files edit, derived from the sections:
`base_config()`, dotted overrides ("rl.lr=3e-4") and `get_config` arguments ("mode=single").

An experiment is a file under configs/ defining `get_config(arg=None) -> ConfigDict` that starts
from `base_config()` and changes what it needs; `arg` is the string after the colon in
`--config=configs/X.py:mode=single,noise=0.5` (read it with `parse_arg`).
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import typing
from typing import Any, Mapping

import ml_collections
from ml_collections import config_dict

from matpo_jax.config.errors import ConfigError
from matpo_jax.config.fields import FieldSpec, field_specs, is_section
from matpo_jax.config.sections import ExperimentConfig


@functools.cache
def schema() -> dict[str, FieldSpec]:
    """Every leaf of the experiment config, by dotted path."""
    return field_specs(ExperimentConfig)


def groups() -> set[str]:
    """Every non-leaf path ("model", "model.arch", ...)."""
    return {path.rsplit(".", i)[0] for path in schema() for i in range(1, path.count(".") + 1)}


CHOICES: dict[str, tuple[str, ...]] = {p: s.choices for p, s in schema().items() if s.choices}
RANGES = {p: s.range for p, s in schema().items() if s.range is not None}


def base_config() -> ml_collections.ConfigDict:
    """Every field an experiment can set, with defaults that run a small MATPO job on a CPU.

    Optional fields (default None) are typed placeholders, so `c.model.tokenizer = "..."` and
    `--config.model.tokenizer=...` work. Help for each field: matpo_jax/config/sections.py.
    """
    return _as_configdict(ExperimentConfig)


def _as_configdict(cls: type) -> ml_collections.ConfigDict:
    out = ml_collections.ConfigDict()
    specs = {path.rpartition(".")[2]: spec for path, spec in field_specs(cls).items()}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if is_section(hints[f.name]):
            out[f.name] = _as_configdict(hints[f.name])
            continue
        spec = specs[f.name]
        out[f.name] = (config_dict.placeholder(spec.kind) if spec.default is None
                       else spec.default)
    return out


def flatten(tree, prefix: str = "") -> dict[str, Any]:
    """{"rl.lr": 1e-5, ...} from a nested ConfigDict / mapping / ExperimentConfig."""
    if dataclasses.is_dataclass(tree):
        tree = {f.name: getattr(tree, f.name) for f in dataclasses.fields(tree)}
    out = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, (Mapping, ml_collections.ConfigDict, config_dict.FrozenConfigDict)) \
                or dataclasses.is_dataclass(value):
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


def lookup(cfg, path: str):
    for name in path.split("."):
        cfg = cfg[name]
    return cfg


def unknown_field_message(path: str) -> str:
    # Prefer a sibling (rl.lrr -> rl.lr), then any field (lr -> rl.lr).
    known = list(schema())
    parent = path.rpartition(".")[0]
    siblings = [p for p in known if p.rpartition(".")[0] == parent]
    match = (difflib.get_close_matches(path, siblings, n=1, cutoff=0.6)
             or difflib.get_close_matches(path, known, n=1, cutoff=0.6))
    hint = f" (did you mean {match[0]}?)" if match else ""
    return f"unknown field {path}{hint}"


def apply_overrides(cfg: ml_collections.ConfigDict, overrides: str | Mapping[str, Any] | None):
    """Sets dotted fields ("rollout.mode=single,rl.lr=3e-4"); text is parsed by the field's
    declared type (tuples: items joined by "+"). Returns `cfg`."""
    if isinstance(overrides, str) or overrides is None:
        pairs = [item.partition("=") for item in (overrides or "").split(",") if item.strip()]
        overrides = {key.strip(): value.strip() for key, _, value in pairs}
    specs = schema()
    for path, value in overrides.items():
        if path not in specs:
            raise ConfigError(unknown_field_message(path))
        if isinstance(value, str) and (specs[path].kind is not str or specs[path].optional):
            value = specs[path].parse(value)
        parent, _, name = path.rpartition(".")
        group = lookup(cfg, parent) if parent else cfg
        try:
            group[name] = value
        except (TypeError, ValueError) as error:  # ConfigDict's type safety
            raise ConfigError(f"{path} = {value!r}: expected {specs[path].type_name} "
                              f"({error})") from None
    return cfg


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
        kind = tuple if isinstance(default, (tuple, list)) else type(default)
        spec = FieldSpec(path=key, kind=kind, optional=False, default=default, help="")
        out[key] = spec.parse(text if has_value else "true")
    return out
