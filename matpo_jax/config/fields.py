"""How a config field is declared once: default, type, allowed values and help, and what follows
from that declaration (type checks, range and choice checks, parsing command-line text).

    lr: float = setting(1e-5, "peak learning rate", range=POSITIVE)

The type comes from the dataclass annotation: int, float, bool, str, `str | None` (optional) or
`tuple[str, ...]`; a field whose type is another section dataclass is a nested group.
"""
from __future__ import annotations

import dataclasses
import math
import operator
import types
import typing
from typing import Any, ClassVar, Mapping

from matpo_jax.config.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Interval:
    """Allowed numeric range; None ends are open."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def violation(self, value: float) -> str | None:
        for bound, holds, symbol in ((self.ge, operator.ge, ">="), (self.gt, operator.gt, ">"),
                                     (self.le, operator.le, "<="), (self.lt, operator.lt, "<")):
            if bound is not None and not holds(value, bound):
                return f"must be {symbol} {bound:g}"
        return None


POSITIVE = Interval(gt=0)
AT_LEAST_ONE = Interval(ge=1)
NON_NEGATIVE = Interval(ge=0)
UNIT = Interval(ge=0, le=1)
# numpy's generators take non-negative seeds and jax's keys 32-bit ones: a seed outside this
# range passed validation and died after SFT in grain or numpy.
SEED = Interval(ge=0, le=2**31 - 1)

_META = "matpo_config"  # the dataclasses.field metadata key of a setting


def setting(default: Any, help: str, *, choices: tuple[str, ...] = (),
            range: Interval | None = None) -> Any:  # noqa: A002 - reads well at the call site
    """A config field: its default, one line of help, and the values it accepts."""
    return dataclasses.field(default=default,
                             metadata={_META: dict(help=help, choices=tuple(choices), range=range)})


def group(cls: type, help: str) -> Any:
    """A nested section (e.g. model.arch), defaulting to the section's own defaults."""
    return dataclasses.field(default_factory=cls, metadata={_META: dict(help=help)})


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """Everything declared about one leaf of the config."""

    path: str  # "rollout.max_context"
    kind: type  # int | float | bool | str | tuple
    optional: bool  # None is allowed
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    range: Interval | None = None

    @property
    def type_name(self) -> str:
        return self.kind.__name__

    def problems(self, value: Any) -> list[str]:
        """What is wrong with `value` for this field (empty: nothing), one line each."""
        path = self.path
        if value is None:
            return [] if self.optional else [f"{path} is None: expected {self.type_name}"]
        if not _has_kind(value, self.kind):
            return [f"{path} = {value!r}: expected {self.type_name}, got {type(value).__name__}"]
        if self.kind is float and not math.isfinite(value):
            return [f"{path} = {value!r}: must be a number, got nan" if math.isnan(value)
                    else f"{path} = {value!r}: must be finite"]
        problems = []
        if self.choices:
            for item in value if self.kind is tuple else (value,):
                if item not in self.choices:
                    problems.append(f"{path} = {item!r}: must be one of {', '.join(self.choices)}")
        if self.range is not None and (violation := self.range.violation(value)):
            problems.append(f"{path} = {value!r}: {violation}")
        return problems

    def normalize(self, value: Any) -> Any:
        """The stored form of a valid value: ints widened to float, sequences to tuples."""
        if value is None:
            return None
        if self.kind is float:
            return float(value)
        if self.kind is tuple:
            return tuple(value)
        return value

    def parse(self, text: str) -> Any:
        """Command-line text -> value ("3e-4", "true", "none" for optional, "a+b" for tuples)."""
        stripped = text.strip()
        if self.optional and stripped.lower() in ("none", "null"):
            return None
        try:
            if self.kind is bool:
                lowered = stripped.lower()
                if lowered not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(text)
                return lowered in ("true", "1", "yes")
            if self.kind is tuple:
                cleaned = stripped.strip("()[]")
                parts = cleaned.replace("+", ",").split(",")
                return tuple(p.strip().strip("'\"") for p in parts if p.strip().strip("'\""))
            if self.kind is int:
                return int(stripped)
            if self.kind is float:
                return float(stripped)
            return text
        except ValueError:
            raise ConfigError(f"{self.path} = {text!r}: expected {self.type_name}") from None


def _has_kind(value: Any, kind: type) -> bool:
    is_int = isinstance(value, int) and not isinstance(value, bool)
    return {int: is_int, float: is_int or isinstance(value, float),
            bool: isinstance(value, bool), str: isinstance(value, str),
            tuple: isinstance(value, (tuple, list))}[kind]


def _leaf_kind(annotation: Any) -> tuple[type, bool]:
    """(kind, optional) of a leaf annotation: int, float, bool, str, str | None, tuple[str, ...]."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1 or len(args) != 2:
            raise TypeError(f"unsupported config annotation {annotation}")
        return _leaf_kind(inner[0])[0], True
    if typing.get_origin(annotation) is tuple:
        return tuple, False
    if annotation in (int, float, bool, str):
        return annotation, False
    raise TypeError(f"unsupported config annotation {annotation}")


def is_section(cls: Any) -> bool:
    return isinstance(cls, type) and dataclasses.is_dataclass(cls) and issubclass(cls, Section)


def field_specs(cls: type, prefix: str = "") -> dict[str, FieldSpec]:
    """Every leaf of a section dataclass (nested groups flattened), keyed by dotted path."""
    hints = typing.get_type_hints(cls)
    specs: dict[str, FieldSpec] = {}
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        annotation = hints[f.name]
        if is_section(annotation):
            specs.update(field_specs(annotation, path + "."))
            continue
        meta = f.metadata.get(_META)
        if meta is None:
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with setting()")
        kind, optional = _leaf_kind(annotation)
        specs[path] = FieldSpec(path=path, kind=kind, optional=optional, default=f.default,
                                help=meta["help"], choices=meta["choices"], range=meta["range"])
    return specs


class Section:
    """Base of the frozen section dataclasses: values are normalised and checked on construction,
    so a section object is always valid (ConfigError naming every bad field otherwise)."""

    PATH: ClassVar[str]  # where the section sits in the experiment config ("rollout", "model.arch")

    def __post_init__(self):
        specs = self.leaf_specs()
        problems = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            spec = specs.get(f.name)
            if spec is None:  # a nested section: constructed (hence checked) on its own
                continue
            found = spec.problems(value)
            problems += found
            if not found:
                object.__setattr__(self, f.name, spec.normalize(value))
        if not problems:
            problems = self.consistency_problems()
        if problems:
            raise ConfigError(problems)

    def consistency_problems(self) -> list[str]:
        """Checks between this section's own fields (the fields themselves are valid)."""
        return []

    @classmethod
    def leaf_specs(cls) -> dict[str, FieldSpec]:
        """This section's own leaves by field name (nested groups excluded)."""
        cached = cls.__dict__.get("_leaf_specs")
        if cached is None:
            cached = {path.rpartition(".")[2]: spec
                      for path, spec in field_specs(cls, cls.PATH + ".").items()
                      if path.count(".") == cls.PATH.count(".") + 1}
            cls._leaf_specs = cached
        return cached

    @classmethod
    def unchecked(cls, values: Mapping[str, Any]):
        """A section from values whose fields are already checked, skipping the consistency
        checks (to_typed collects those of every section before raising)."""
        obj = object.__new__(cls)
        specs = cls.leaf_specs()
        for f in dataclasses.fields(cls):
            value = values[f.name]
            object.__setattr__(obj, f.name, specs[f.name].normalize(value) if f.name in specs
                               else value)
        return obj
