"""The command line of the entry points (train, demo): --config=FILE[:ARG] with per-field
overrides --config.a.b=value, --workdir, --verbose, --allow_config_change; user errors as one line.

    python -m matpo_jax.train --config=configs/synthetic_repro.py:mode=single --config.rl.lr=3e-4 \
        --workdir=runs/x

Overrides are parsed here, by each field's declared type, before absl sees the rest of the flags
(absl would call `--config.rl.lr` an unknown flag). A user error (a missing or broken config file,
an unknown field, a wrong type, a bad mesh, an unwritable workdir, a changed config on resume)
prints `FATAL config error: <one line per problem>` and exits 2; --verbose adds the traceback.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
import socket
import sys
import tempfile
from typing import Callable

import ml_collections
from absl import flags

from matpo_jax.config.configdict import apply_overrides, groups, schema, unknown_field_message
from matpo_jax.config.errors import ConfigError
from matpo_jax.config.files import load_config_file
from matpo_jax.config.resume import check_resume
from matpo_jax.config.sections import ExperimentConfig
from matpo_jax.config.validation import to_typed
from matpo_jax.report.files import run_path


@dataclasses.dataclass
class ConfigFlag:
    """--config and its overrides; `value` is the loaded ConfigDict once the flags are parsed."""

    name: str
    flag_values: flags.FlagValues
    value: ml_collections.ConfigDict | None = None
    overrides: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class RunFlags:
    """The flags every run entry point shares."""

    config: ConfigFlag
    workdir: flags.FlagHolder
    verbose: flags.FlagHolder
    allow_config_change: flags.FlagHolder

    def checked_start(self, *, check_files: bool = True,
                      resume_check: bool = True) -> tuple[ExperimentConfig, str]:
        """The config and the workdir (created), with everything checked that needs no jax, so a
        bad command line fails in a second: the config, the workdir, and (resume_check) the
        changes a rerun makes to a saved run; then the log level of --verbose."""
        cfg = config_from_flags(self.config, check_files=check_files)
        workdir = check_workdir(self.workdir.value)
        if resume_check:
            check_resume(cfg, workdir, self.allow_config_change.value)
        from matpo_jax.report import logs  # its third-party imports wait for a valid command
        logs.configure(verbose=self.verbose.value)
        return cfg, workdir

    def config_for_devices(self, *, check_files: bool = True) -> ExperimentConfig:
        """The config checked once more, now against the devices jax sees (the mesh)."""
        import jax  # after checked_start: jax starts only for a valid command line
        return config_from_flags(self.config, jax.device_count(), check_files=check_files)


_CONFIG_FLAGS: dict[tuple[int, str], ConfigFlag] = {}


def define_flags(config_flag: str = "config", flag_values: flags.FlagValues = flags.FLAGS, *,
                 default_config: str | None = None, default_workdir: str | None = None,
                 with_workdir: bool = True):
    """Defines --config (a config file, overridable per field) and --workdir (unless
    `with_workdir` is False: a command that writes no run, e.g. plan); returns the holders (the
    config holder's `value` is filled by `parse_flags`; the workdir holder None without one)."""
    flags.DEFINE_string(config_flag, default_config,
                        "Experiment config file[:argument], e.g. configs/base.py; fields are "
                        "overridden with --config.a.b=value.", flag_values=flag_values)
    workdir = flags.DEFINE_string("workdir", default_workdir,
                                  "Run directory: checkpoints, metrics, plots.",
                                  flag_values=flag_values) if with_workdir else None
    holder = ConfigFlag(config_flag, flag_values)
    _CONFIG_FLAGS[(id(flag_values), config_flag)] = holder
    return holder, workdir


def define_run_flags(flag_values: flags.FlagValues = flags.FLAGS, *,
                     default_config: str | None = None,
                     default_workdir: str | None = None) -> RunFlags:
    config, workdir = define_flags(flag_values=flag_values, default_config=default_config,
                                   default_workdir=default_workdir)
    verbose = flags.DEFINE_bool("verbose", False, "Full tracebacks on errors; keep third-party "
                                "INFO logs (Orbax, TFDS...).", flag_values=flag_values)
    allow = flags.DEFINE_string(
        "allow_config_change", "", "Fields a resumed run may change, comma-separated, among "
        "train.steps and the train.*_every cadences (see config/resume.py).",
        flag_values=flag_values)
    return RunFlags(config, workdir, verbose, allow)


def _override_pattern(config_flag: str) -> re.Pattern:
    return re.compile(rf"^--?{re.escape(config_flag)}\.([\w.]+)(?:=(.*))?$", re.DOTALL)


def _split_overrides(argv: list[str], config_flag: str) -> tuple[dict[str, str], list[str]]:
    """(--config.a.b overrides by path, the other arguments)."""
    pattern = _override_pattern(config_flag)
    overrides, rest = {}, [argv[0]] if argv else []
    args = iter(argv[1:])
    for arg in args:
        if arg == "--":
            rest += [arg, *args]
            break
        match = pattern.match(arg)
        if match is None:
            rest.append(arg)
            continue
        path, text = match.group(1), match.group(2)
        if text is None:  # "--config.a.b value", or a bare bool "--config.a.b"
            spec = schema().get(path)
            if spec is not None and spec.kind is bool:
                text = "true"
            else:
                text = next(args, None)
                if text is None:
                    raise ConfigError(f"--{config_flag}.{path} needs a value "
                                      f"(--{config_flag}.{path}=...)")
        overrides[path] = text
    return overrides, rest


def parse_flags(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS,
                config_flag: str = "config") -> list[str]:
    """Parses argv like absl does, loads --config and applies its overrides; every problem is a
    ConfigError naming the field, flag or file. Returns the arguments that are not flags."""
    holder = _CONFIG_FLAGS[(id(flag_values), config_flag)]
    overrides, rest = _split_overrides(list(argv), config_flag)
    try:
        remaining = flag_values(rest)
    except flags.Error as error:
        raise ConfigError(f"command line: {' '.join(str(error).split())}") from error
    specs, group_paths = schema(), groups()
    problems = []
    for path in overrides:
        if path in group_paths:
            problems.append(f"--{config_flag}.{path} is a group; set its fields "
                            f"(--{config_flag}.{path}.<field>=...)")
        elif path not in specs:
            problems.append(unknown_field_message(path))
    if problems:
        raise ConfigError(problems)
    source = flag_values[config_flag].value
    if source is None:
        if overrides:
            raise ConfigError(f"--{config_flag}.{next(iter(overrides))} needs "
                              f"--{config_flag}=FILE to apply to")
        holder.value = None
        return remaining
    path, _, arg = source.partition(":")
    holder.value = apply_overrides(load_config_file(path, arg or None), overrides)
    holder.overrides = overrides
    return remaining


def flags_parser(argv: list[str]) -> list[str]:
    """`app.run(main, flags_parser=flags_parser)`: a bad command line exits with one clear line."""
    try:
        return parse_flags(argv)
    except ConfigError as error:
        if "--verbose" in argv:
            raise
        fatal(error)


def config_from_flags(config_holder: ConfigFlag, num_devices: int | None = None, *,
                      check_files: bool = True) -> ExperimentConfig:
    """The parsed --config, validated and typed (the mesh checked when num_devices is given)."""
    if config_holder.value is None:
        raise ConfigError(f"--{config_holder.name} is required (e.g. "
                          f"--{config_holder.name}=configs/base.py)")
    return to_typed(config_holder.value, num_devices, check_files=check_files)


def check_workdir(workdir: str | None) -> str:
    """The run directory, created; ConfigError (one line) when it cannot be created or written."""
    if not workdir:
        raise ConfigError("--workdir is required (e.g. --workdir=runs/x)")
    # A quoted "~/x" reaches us unexpanded: it means the home directory, never a "./~" folder.
    workdir = os.path.expanduser(workdir)
    if "://" in workdir:  # an object store: one small object written and deleted proves access
        # named per process: every host of a pod checks at once
        probe = run_path(workdir, f".write_check.{socket.gethostname()}.{os.getpid()}")
        try:
            probe.write_text("")
            probe.unlink()
        except Exception as error:  # noqa: BLE001 - any client error means: not writable
            detail = (str(error).strip().splitlines() or [""])[0][:200]
            raise ConfigError(f"--workdir={workdir}: cannot write there "
                              f"({type(error).__name__}: {detail})") from error
        return workdir
    try:
        os.makedirs(workdir, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"--workdir={workdir}: cannot create it ({error.strerror or error})") \
            from error
    try:
        with tempfile.TemporaryFile(dir=workdir):
            pass
    except OSError as error:
        raise ConfigError(f"--workdir={workdir}: cannot write there ({error.strerror or error})") \
            from error
    return workdir


def fatal(error: ConfigError) -> None:
    print(f"FATAL config error: {error}", file=sys.stderr)
    sys.exit(2)


def one_line_errors(main: Callable[[list[str]], object], verbose_flag: str = "verbose"):
    """Wraps an absl main: a ConfigError raised anywhere in it is printed as one line per problem
    and exits 2, unless --verbose (then the traceback is kept)."""
    @functools.wraps(main)
    def wrapped(argv):
        try:
            return main(argv)
        except ConfigError as error:
            if verbose_flag in flags.FLAGS and flags.FLAGS[verbose_flag].value:
                raise
            fatal(error)
    return wrapped
