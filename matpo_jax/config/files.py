"""Config files in, the run's record out: importing `configs/X.py`, writing config.json (and
every other JSON a run writes) atomically, reading a run's saved config back."""
from __future__ import annotations

import importlib.util
import json
import traceback
from collections.abc import Mapping
from pathlib import Path

import ml_collections

from matpo_jax.config.errors import ConfigError
from matpo_jax.report.files import run_path, write_json_atomic

CONFIG_FILE = "config.json"
RUN_CONFIG_SECTIONS = frozenset({"model", "data", "rl", "train"})  # what every run config holds


def load_config_file(path: str | Path, arg: str | None = None) -> ml_collections.ConfigDict:
    """Imports a config file by path and returns `get_config(arg)`.

    Any failure inside the file (a wrong type set on a field, a typo, a bad argument after the
    colon) is a ConfigError of one line naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    spec = importlib.util.spec_from_file_location(f"_matpo_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        if not hasattr(module, "get_config"):
            raise ConfigError(f"config file {path} defines no get_config()")
        cfg = module.get_config(arg) if arg is not None else module.get_config()
    except SystemExit as error:  # a BaseException: uncaught, `train` would exit 0 having done nothing
        raise ConfigError(_where_in_file(path, error, f"the config file called sys.exit("
                                                      f"{error.code!r}) instead of returning a "
                                                      f"config")) from error
    except ConfigError as error:
        if str(path) in str(error):
            raise
        where = f"{path}:{arg}" if arg else str(path)
        raise ConfigError([f"{where}: {p}" for p in error.problems]) from error
    except Exception as error:  # noqa: BLE001 - re-raised as one line naming file and line
        raise ConfigError(_where_in_file(path, error)) from error
    # None would read as "no --config given"; anything else is not a config either.
    if not isinstance(cfg, (ml_collections.ConfigDict, Mapping)):
        raise ConfigError(f"config file {path}: get_config() returned {type(cfg).__name__}"
                          f"{' (a missing return?)' if cfg is None else ''}, not a config")
    return cfg


def _where_in_file(path: Path, error: BaseException, message: str | None = None) -> str:
    """'configs/x.py:12 (c.rl.lr = "fast"): TypeError: ...' from the innermost frame in `path`."""
    message = message or " ".join(f"{type(error).__name__}: {error}".split())
    if isinstance(error, SyntaxError) and error.lineno:
        return f"{path}:{error.lineno}: SyntaxError: {error.msg}"
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if Path(f.filename).resolve() == path.resolve()]
    if not frames:
        return f"config file {path}: {message}"
    frame = frames[-1]
    return f"{path}:{frame.lineno} ({(frame.line or '').strip()}): {message}"


def config_as_json(cfg) -> dict:
    """The JSON form of a config (ConfigDict or ExperimentConfig): what config.json holds."""
    plain = cfg.to_dict()
    return json.loads(json.dumps(plain, sort_keys=True, default=str))


def save_config(cfg, workdir: str | Path) -> Path:
    """Writes the resolved config to <workdir>/config.json (atomically), the run's record."""
    return write_json_atomic(run_path(workdir, CONFIG_FILE), config_as_json(cfg), indent=2,
                             sort_keys=True)


def read_saved_config(workdir: str | Path) -> dict | None:
    """<workdir>/config.json as a dict; None when the workdir holds no run yet."""
    path = run_path(workdir, CONFIG_FILE)
    if not path.exists():
        return None
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ConfigError(f"{path}: unreadable ({type(error).__name__}: {error}); it records the "
                          f"config of the run in this workdir: restore it or use a new "
                          f"--workdir") from None
    if not isinstance(saved, dict):
        raise ConfigError(f"{path}: not a JSON object; restore it or use a new --workdir")
    if not RUN_CONFIG_SECTIONS <= set(saved):  # e.g. a model's config.json written over it
        kind = f" (a model config: model_type {saved['model_type']!r})" \
            if "model_type" in saved else ""
        raise ConfigError(f"{path}: not a run's config{kind}, though it is where the run in this "
                          "workdir records its config: it was replaced; restore it or use a new "
                          "--workdir")
    return saved

