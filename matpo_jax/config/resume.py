"""A rerun of a workdir resumes the run recorded there, so it must be the same experiment: the saved
config.json is compared with the new config before anything is written, and every changed field
is refused unless it is one that cannot make the resumed run a different one (total steps and
cadences) and the command line allows it."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Iterable

from matpo_jax.config.configdict import flatten, schema
from matpo_jax.config.errors import ConfigError
from matpo_jax.config.files import CONFIG_FILE, config_as_json, read_saved_config
from matpo_jax.report.files import run_path

# Fields a resumed run may change (with --allow_config_change): how long it runs and how often it
# logs, evaluates and checkpoints; never what it trains on or how.
RESUME_SAFE_FIELDS = ("train.steps", "train.log_every", "train.eval_every",
                      "train.checkpoint_every", "train.keep_checkpoints",
                      "train.async_checkpointing")
_ABSENT = "<absent>"
log = logging.getLogger(__name__)


def parse_allowed(text: str | Iterable[str] | None) -> tuple[str, ...]:
    """The --allow_config_change list ("train.steps,train.eval_every"), each a safe field."""
    items = text.split(",") if isinstance(text, str) else list(text or ())
    allowed = tuple(item.strip() for item in items if item.strip())
    unsafe = [item for item in allowed if item not in RESUME_SAFE_FIELDS]
    if unsafe:
        raise ConfigError(f"--allow_config_change={','.join(unsafe)}: only "
                          f"{', '.join(RESUME_SAFE_FIELDS)} may change when a run resumes")
    return allowed


def config_changes(saved: dict, cfg) -> dict[str, tuple[object, object]]:
    """{field: (saved value, new value)} of every field that differs (JSON forms compared)."""
    old, new = flatten(saved), flatten(config_as_json(cfg))
    return {path: (old.get(path, _ABSENT), new.get(path, _ABSENT))
            for path in sorted(set(old) | set(new))
            if old.get(path, _ABSENT) != new.get(path, _ABSENT)}


def schema_drift(changes: dict[str, tuple[object, object]]) -> tuple[list[str], list[str]]:
    """(fields the code gained since the run started, now at their defaults; fields the run
    recorded that the code no longer has). Neither makes the resumed run another experiment: a
    new field at its default is what the old code did (a field is added with the old behaviour
    as its default), and a removed one is no longer read. A new field set otherwise is a change."""
    specs = schema()
    as_json = lambda value: json.loads(json.dumps(value))  # noqa: E731 - tuples -> lists
    added = [path for path, (old, new) in changes.items()
             if old == _ABSENT and path in specs and new == as_json(specs[path].default)]
    removed = [path for path, (old, new) in changes.items()
               if new == _ABSENT and path not in specs]
    return added, removed


def check_resume(cfg, workdir: str | Path, allow: str | Iterable[str] | None = ()) -> list[str]:
    """Refuses (ConfigError, one line per changed field) to resume the run in `workdir` with a
    config other than the one it was started with, except for the allowed safe fields.
    Returns the allowed fields that did change (empty for a fresh workdir)."""
    allowed = parse_allowed(allow)
    saved = read_saved_config(workdir)
    if saved is None:
        return []
    changes = config_changes(saved, cfg)
    added, removed = schema_drift(changes)
    if added:
        log.info("resuming %s: the run predates %s; taken at their defaults", workdir,
                 ", ".join(f"{path} = {changes[path][1]!r}" for path in added))
    if removed:
        log.warning("resuming %s: its config.json has %s, which this code no longer has "
                    "(ignored)", workdir, ", ".join(f"{path} = {changes[path][0]!r}"
                                                   for path in removed))
    changes = {path: c for path, c in changes.items() if path not in added + removed}
    refused = [path for path in changes if path not in allowed]
    if refused:
        record = run_path(workdir, CONFIG_FILE)
        lines = [f"{path} = {changes[path][1]!r}, but the run in {workdir} has "
                 f"{changes[path][0]!r} ({record})" for path in refused]
        safe = [path for path in refused if path in RESUME_SAFE_FIELDS]
        hint = (f"--allow_config_change={','.join(safe)} accepts the change of "
                f"{', '.join(safe)}; " if safe else "")
        lines.append(f"refusing to resume with a changed config: {hint}a new --workdir starts "
                     f"a fresh run")
        raise ConfigError(lines)
    return [path for path in changes]
