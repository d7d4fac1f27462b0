"""A run's files, on a local disk or on an object store (`gs://bucket/run`), through one set of
functions: local paths are `pathlib.Path` and behave as plain files; URIs are `etils.epath.Path`,
which reaches Google Cloud Storage through its fsspec backend (gcsfs) when TensorFlow is absent.

Files a run writes whole are written atomically, so a crash leaves either the old file or the new
one, never a torn one (a resume reads them): locally to a temporary file beside the target, then
renamed over it; on an object store as one object write (an upload replaces the object whole, so
readers see the old object or the new one). Object stores cannot append: an appended file
(metrics.jsonl, consumed.jsonl, benchmark JSONL) is rewritten whole there on every flush.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any


def is_remote(path: str | os.PathLike) -> bool:
    """True for an object-store URI (gs://, s3://, ...), False for a local path."""
    return "://" in os.fspath(path)


def run_path(path: str | os.PathLike, *parts: str):
    """`path`/`parts` as a path object: pathlib.Path locally, etils.epath.Path for a URI
    (pathlib would collapse "gs://b" into the local folder "gs:/b")."""
    if is_remote(path):
        from etils import epath  # imported here: only remote workdirs need it

        return epath.Path(os.fspath(path), *parts)
    return Path(path, *parts)


def absolute(path: str | os.PathLike) -> str:
    """os.path.abspath for a local path; a URI is already absolute."""
    return os.fspath(path) if is_remote(path) else os.path.abspath(path)


def makedirs(path: str | os.PathLike) -> None:
    """Creates a local directory (and its parents); object stores have no directories to make."""
    if not is_remote(path):
        os.makedirs(path, exist_ok=True)


def local_dir_for(path: str | os.PathLike, *parts: str) -> str:
    """`path`/`parts` when local; for a URI, a folder on this machine standing in for it, for what
    must live on a local disk (the world's TFDS records, corpus and tokenizer, which array_record,
    the search service and the tokenizer read as local files). The same URI always maps to the
    same folder ($XDG_CACHE_HOME or ~/.cache, then matpo_jax/<scheme>/<bucket>/<path>), so a rerun
    on the same host finds what it prepared."""
    if not is_remote(path):
        return os.path.join(path, *parts)
    scheme, _, rest = os.fspath(path).partition("://")
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "matpo_jax", scheme, *[p for p in rest.split("/") if p], *parts)


def current_umask() -> int:
    """The process's umask, read without changing it where Linux shows it (os.umask can only be
    read by setting it, which would briefly give other threads' new files another mode)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Writes `data` to `path` atomically: locally a temp file in the same directory + os.replace
    (fsync'd first); on an object store a single object upload."""
    if is_remote(path):
        run_path(path).write_bytes(data)
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp makes the file 0600: give it the mode open() would (the file it replaces keeps
        # its own), so a TensorBoard server or a teammate can read config.json, eval/, plots/.
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
        except FileNotFoundError:
            mode = 0o666 & ~current_umask()
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Writes `text` (UTF-8) to `path` atomically (see write_bytes_atomic)."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike, value: Any, **dump_kwargs):
    """json.dump of `value` to `path` (newline-terminated), atomically (see write_bytes_atomic).
    Returns the path (a pathlib.Path for a local one)."""
    write_text_atomic(path, json.dumps(value, **dump_kwargs) + "\n")
    return run_path(path)


def append_text(path: str | os.PathLike, text: str) -> None:
    """Appends `text` to `path`, on disk when this returns (fsync'd locally; on an object store the
    object is rewritten whole with `text` added)."""
    if is_remote(path):
        with open_append(path) as f:
            f.write(text)
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def open_append(path: str | os.PathLike):
    """A text file open for appending: locally the file itself (mode "a"); on an object store a
    writer holding the object's content that rewrites the object whole on each flush()/close()."""
    if is_remote(path):
        return _ObjectAppender(path)
    return open(path, "a", encoding="utf-8")


class _ObjectAppender:
    """Append mode for an object store: the object's text (read at open) plus what was written
    since, uploaded whole by flush(). One upload per flush, so a reader never sees half a line."""

    def __init__(self, path: str | os.PathLike):
        self._path = run_path(path)
        self._chunks = [self._path.read_text(encoding="utf-8")] if self._path.exists() else []
        self._pending = False

    def write(self, text: str) -> int:
        self._chunks.append(text)
        self._pending = True
        return len(text)

    def flush(self) -> None:
        if self._pending:
            text = "".join(self._chunks)
            self._chunks = [text]
            self._path.write_text(text, encoding="utf-8")
            self._pending = False

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> "_ObjectAppender":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def copy_tree(source: str | os.PathLike, destination: str | os.PathLike) -> None:
    """Copies the files of the local directory `source` into `destination` (local or remote)."""
    for root, _, names in os.walk(source):
        relative = os.path.relpath(root, source)
        for name in names:
            target = run_path(destination, *([] if relative == "." else [relative]), name)
            if is_remote(destination):
                target.write_bytes(Path(root, name).read_bytes())
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(os.path.join(root, name), target)
