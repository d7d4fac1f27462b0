"""Files a run writes whole: written to a temporary file beside the target, then renamed over it,
so a crash leaves either the old file or the new one, never a torn one (a resume reads them)."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Writes `text` to `path` atomically (temp file in the same directory + os.replace)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str | os.PathLike, value: Any, **dump_kwargs) -> Path:
    """json.dump of `value` to `path` (newline-terminated), atomically (see write_text_atomic)."""
    write_text_atomic(path, json.dumps(value, **dump_kwargs) + "\n")
    return Path(path)
