"""Writers never write into a directory they do not own (export's Hugging Face directory, pretrain's
warm start).

A writer owns its output directory when the directory is new or empty, or when it holds the
writer's manifest (export.json, warm_start.json) and only the files that manifest lists: a
directory the writer wrote before. Anything else is refused with one line naming the directory
and what is in it: a run's workdir (whose config.json a Hugging Face config.json would replace), or
a directory with files of others (a previous export's stale tokenizer files would be read with the
new ones). Output is written into a staging directory beside `out` and then moved in: the files
the previous write listed are removed first, so nothing of an earlier write survives beside the
new one, and an interrupted write leaves `out` as it was.

    previous = claim(out, "export.json", writer="export")
    stage = staging_dir(out)
    ... write every file into stage, the manifest (listing them) last ...
    publish(stage, out, previous, "export.json")
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile

from matpo_jax.config.errors import ConfigError
from matpo_jax.report import files

RUN_MARKERS = ("run.lock", "checkpoints", "metrics.jsonl")  # what only a run's workdir holds
SHOWN = 3  # file names a refusal lists


class OutputDirError(ConfigError):
    """An output directory the writer does not own (one line naming it and what it holds)."""


def _names(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def _listing(names: list[str]) -> str:
    more = len(names) - SHOWN
    return ", ".join(names[:SHOWN]) + (f" and {more} more" if more > 0 else "")


def claim(out: str, manifest: str, *, writer: str) -> list[str]:
    """Checks that `writer` owns `out` (see the module doc); returns the files its previous write
    left there (to be replaced by `publish`), empty for a new or empty directory."""
    directory = files.run_path(out)
    if not directory.exists():
        return []
    if not directory.is_dir():
        raise OutputDirError(f"--out={out} is a file, not a directory")
    present = _names(directory)
    if not present:
        return []
    markers = [name for name in RUN_MARKERS if name in present]
    if markers:
        raise OutputDirError(
            f"--out={out} is a run's workdir (it holds {', '.join(markers)}): {writer} would "
            "replace files the run needs to resume (its config.json); write to a new directory")
    if manifest not in present:
        raise OutputDirError(
            f"--out={out} is not empty and {writer} did not write it (it holds "
            f"{_listing(present)}; no {manifest}): files of others would mix with its own; "
            "write to a new or empty directory")
    try:
        record = json.loads((directory / manifest).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise OutputDirError(f"{os.path.join(out, manifest)}: unreadable ({error}); remove "
                             f"{out} or write to a new directory") from None
    listed = record.get("files") if isinstance(record, dict) else None
    if listed is None:  # a write from before manifests listed their files: all of it is its
        return present
    others = [name for name in present if name not in set(listed) | {manifest}]
    if others:
        raise OutputDirError(
            f"--out={out} holds files {writer} did not write ({_listing(others)}, not in its "
            f"{manifest}): they would mix with its own; remove them or write to a new directory")
    return [name for name in present if name in set(listed) | {manifest}]


def staging_dir(out: str) -> str:
    """A new local directory the output is written into before `publish` moves it to `out`:
    beside `out` (one filesystem: the move is a rename), or in the temp dir for a remote `out`."""
    if files.is_remote(out):
        return tempfile.mkdtemp(prefix="matpo_output_")
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(os.path.abspath(out))}"
                                                ".partial-")


def _usual_modes(stage: str) -> None:
    """What open() and mkdir() give (the umask's), not mkdtemp's 0700 or a library's 0600: the
    output is for others to read (a model server, a teammate)."""
    mask = files.current_umask()
    os.chmod(stage, 0o777 & ~mask)
    for name in os.listdir(stage):
        path = os.path.join(stage, name)
        os.chmod(path, (0o777 if os.path.isdir(path) else 0o666) & ~mask)


def publish(stage: str, out: str, previous: list[str], manifest: str) -> None:
    """Moves the staged files into `out`, after removing the `previous` write's files, the
    manifest last (until it is replaced, the old one still lists what is there); the staging
    directory is gone afterwards (also when this fails)."""
    try:
        _usual_modes(stage)
        if files.is_remote(out):
            for name in previous:
                files.run_path(out, name).unlink()
            files.copy_tree(stage, out)
            return
        if not os.path.exists(out):
            os.rename(stage, out)
            return
        for name in previous:
            path = os.path.join(out, name)
            if name != manifest:
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        for name in sorted(os.listdir(stage), key=lambda n: n == manifest):
            os.replace(os.path.join(stage, name), os.path.join(out, name))
    finally:
        shutil.rmtree(stage, ignore_errors=True)
