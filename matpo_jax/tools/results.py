"""What a tool call gives back (ToolResult), how failures are named, and the counters over calls.

A rollout must never die because a tool did: every failure (transport, protocol, the model's own
mistake) becomes a ToolResult with `ok=False`, a short text the model can read, and an
`error_kind` that is counted per tool.
"""
from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Mapping

from matpo_jax.tools.transport import (BLOCKED_URL, CONNECTION_ERROR, PROTOCOL_ERROR, TIMEOUT,
                                       TOO_MANY_REDIRECTS)

# Error kinds (metrics keys). Transport: CONNECTION_ERROR, TIMEOUT, PROTOCOL_ERROR, BLOCKED_URL,
# TOO_MANY_REDIRECTS (see transport.py). Responses:
SERVER_ERROR = "server_error"  # 5xx (and 429) still failing after the retries
CLIENT_ERROR = "client_error"  # other 4xx: never retried
INVALID_JSON = "invalid_json"
BAD_RESPONSE = "bad_response"  # valid JSON of an unexpected shape, an unreadable document
TOO_LARGE = "too_large"  # a response over the byte cap that is unusable once cut (JSON, PDF)
UNSUPPORTED_CONTENT = "unsupported_content"  # a page of a type `open` cannot read (images...)
# The model's own mistakes and our bugs:
BAD_ARGUMENTS = "bad_arguments"
UNKNOWN_TOOL = "unknown_tool"
MALFORMED_CALL = "malformed_call"
INTERNAL_ERROR = "internal_error"

__all__ = ["BLOCKED_URL", "CONNECTION_ERROR", "PROTOCOL_ERROR", "TIMEOUT", "TOO_MANY_REDIRECTS",
           "SERVER_ERROR", "CLIENT_ERROR", "INVALID_JSON", "BAD_RESPONSE", "TOO_LARGE",
           "UNSUPPORTED_CONTENT", "BAD_ARGUMENTS", "UNKNOWN_TOOL", "MALFORMED_CALL",
           "INTERNAL_ERROR", "ToolResult", "ToolFailure", "ToolMetrics"]


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """What a tool gives back to the model. `text` is always shown; `error_kind` names a failure."""

    text: str
    ok: bool
    error_kind: str | None = None
    truncated: bool = False  # the text (or the response) was cut at a size cap

    @property
    def error(self) -> str | None:
        return None if self.ok else self.text


class ToolFailure(Exception):
    """A failed tool call: `kind` is the metrics key, `message` is shown to the model."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message


class ToolMetrics:
    """Thread-safe counters: "{tool}/calls", "{tool}/ok", "{tool}/truncated", "{tool}/error/{kind}",
    and for cached tools "{tool}/cache_hits" / "{tool}/cache_misses"."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: collections.Counter[str] = collections.Counter()

    def record(self, tool: str, result: ToolResult, cache_hit: bool | None = None) -> None:
        """cache_hit: None for a call that did not consult a cache."""
        with self._lock:
            self._counts[f"{tool}/calls"] += 1
            self._counts[f"{tool}/ok" if result.ok else f"{tool}/error/{result.error_kind}"] += 1
            if result.truncated:
                self._counts[f"{tool}/truncated"] += 1
            if cache_hit is not None:
                self._counts[f"{tool}/cache_hits" if cache_hit else f"{tool}/cache_misses"] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def errors(self, kind: str | None = None) -> int:
        """Number of failed calls (of one kind, or all)."""
        with self._lock:
            if kind is None:
                return sum(n for key, n in self._counts.items() if "/error/" in key)
            return sum(n for key, n in self._counts.items() if key.endswith(f"/error/{kind}"))

    def cache_hit_rate(self) -> float | None:
        """Hits over cache lookups, all tools together (None before any lookup)."""
        return hit_rate(self.snapshot())


def hit_rate(counts: Mapping[str, int]) -> float | None:
    hits = sum(n for key, n in counts.items() if key.endswith("/cache_hits"))
    misses = sum(n for key, n in counts.items() if key.endswith("/cache_misses"))
    return hits / (hits + misses) if hits + misses else None


def counts_since(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, float]:
    """The calls between two snapshots as metrics: "tools/{key}" counts (those that moved) and
    "tools/cache_hit_rate" when the cache was consulted."""
    delta = {key: after[key] - before.get(key, 0) for key in after}
    out: dict[str, float] = {f"tools/{key}": n for key, n in sorted(delta.items()) if n}
    rate = hit_rate(delta)
    if rate is not None:
        out["tools/cache_hit_rate"] = rate
    return out
