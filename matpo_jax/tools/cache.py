"""A disk cache of tool results, so evaluation reruns and resumed runs never pay for a call twice.

Keys are the tool, the service it asked (class and endpoint) and its arguments normalised
(keys sorted, text NFC-normalised with its whitespace collapsed, defaults filled in by the
tool, URL fragments dropped), hashed. Only successful results are stored: a failure may be
transient. The store is diskcache (SQLite): safe across threads and processes on one machine.
A cache that fails (disk full, a corrupt file) is logged once and bypassed: it never fails a call.
"""
from __future__ import annotations

import hashlib
import json
import logging
import unicodedata
from typing import Any, Mapping

log = logging.getLogger(__name__)


def normalise(value: Any) -> Any:
    """Arguments as they are compared: text NFC with single spaces, mappings by sorted key."""
    if isinstance(value, str):
        return " ".join(unicodedata.normalize("NFC", value).split())
    if isinstance(value, Mapping):
        return {str(k): normalise(v) for k, v in sorted(value.items())}
    if isinstance(value, (list, tuple)):
        return [normalise(v) for v in value]
    return value


def cache_key(tool: str, service: str, arguments: Mapping[str, Any]) -> str:
    # ensure_ascii: lone surrogates and other odd text hash fine (they are escaped, not encoded).
    text = json.dumps([tool, service, normalise(arguments)], sort_keys=True, ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


class ToolCache:
    """`get(key)` -> (text, truncated) or None; `put(key, text, truncated)`."""

    def __init__(self, directory: str, size_limit_bytes: int = 2 << 30):
        import diskcache  # only runs with a cache need it loaded

        self.directory = str(directory)
        self._store = diskcache.Cache(self.directory, size_limit=size_limit_bytes)
        self._failed = False

    def get(self, key: str) -> tuple[str, bool] | None:
        try:
            value = self._store.get(key)
        except Exception as e:  # noqa: BLE001 - a broken cache must not fail the call
            self._warn(e)
            return None
        if (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str)
                and isinstance(value[1], bool)):
            return value
        return None

    def put(self, key: str, text: str, truncated: bool) -> None:
        try:
            self._store.set(key, (text, bool(truncated)))
        except Exception as e:  # noqa: BLE001
            self._warn(e)

    def __len__(self) -> int:
        return len(self._store)

    def close(self) -> None:
        self._store.close()

    def _warn(self, error: Exception) -> None:
        if not self._failed:
            self._failed = True
            log.warning("tool cache at %s failed (%s: %s); calls go on uncached",
                        self.directory, type(error).__name__, error)
