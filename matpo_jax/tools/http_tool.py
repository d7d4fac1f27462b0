"""The base of every HTTP tool: one deadline per call, bounded retries, byte and character caps,
an optional disk cache, and results instead of exceptions.

Endpoint convention: a tool is given the URL it calls, as the service documents it
("https://google.serper.dev/search", "http://127.0.0.1:8000/retrieve"), and uses it as is.
A bare origin ("http://127.0.0.1:8000", no path) is completed with the protocol's standard path
(`default_path`: /search, /retrieve, /page), which is how our local service is addressed.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import time
from typing import Any, Mapping
from urllib.parse import urlsplit

from matpo_jax.tools import addresses, redaction
from matpo_jax.tools.addresses import AddressPolicy
from matpo_jax.tools.cache import ToolCache, cache_key
from matpo_jax.tools.results import (BAD_ARGUMENTS, BAD_RESPONSE, CLIENT_ERROR, INTERNAL_ERROR,
                                     INVALID_JSON, SERVER_ERROR, TOO_LARGE, ToolFailure,
                                     ToolMetrics, ToolResult)
from matpo_jax.tools.transport import HttpTransport, Limits, Response, TransportError

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class HttpPolicy:
    """Timeouts, retries and caps shared by the clients."""

    connect_timeout_s: float = 3.0
    read_timeout_s: float = 15.0  # per socket operation
    deadline_s: float = 60.0  # the whole call: every attempt, redirect, header and body byte
    max_retries: int = 2  # extra attempts after the first, on transient failures only
    backoff_s: float = 0.25  # first wait; doubles each retry
    max_response_bytes: int = 2_000_000  # stop reading past this
    max_chars: int = 20_000  # text handed to the model (the paper's tool-response cap)
    max_redirects: int = 5

    def __post_init__(self):
        for name in ("connect_timeout_s", "read_timeout_s", "deadline_s", "max_response_bytes",
                     "max_chars"):
            if not getattr(self, name) > 0:
                raise ValueError(f"HttpPolicy.{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("max_retries", "backoff_s", "max_redirects"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"HttpPolicy.{name} must be >= 0, got {getattr(self, name)!r}")


class Truncated(Exception):
    """Raised by run() with usable text that was cut at the response cap (flags truncation)."""

    def __init__(self, text: str):
        super().__init__("truncated")
        self.text = text


def endpoint_url(url: str, default_path: str) -> str:
    """`url` as given; a bare origin gets `default_path` (see the module docstring)."""
    url = url.strip()
    parts = urlsplit(url)
    if parts.path in ("", "/") and not parts.query:
        return url.rstrip("/") + default_path
    return url


def parse_json(response: Response) -> Any:
    if response.capped:
        raise ToolFailure(TOO_LARGE, "the response was larger than the size limit")
    try:
        return json.loads(response.body)
    except (ValueError, RecursionError):  # bad JSON or bytes; absurd nesting or numbers
        raise ToolFailure(INVALID_JSON, "the service returned invalid JSON") from None


def response_text(response: Response) -> str:
    return response.body.decode(_charset(response.content_type), errors="replace")


def _charset(content_type: str) -> str:
    for part in content_type.split(";")[1:]:
        key, _, value = part.strip().partition("=")
        if key.lower() == "charset" and value:
            charset = value.strip().strip('"')
            try:
                "".encode(charset)
                return charset
            except LookupError:
                break
    return "utf-8"


def _is_transient(status: int) -> bool:
    return status >= 500 or status == 429  # 429: rate limited, worth a later try


def _error_detail(response: Response) -> str:
    """The service's own short error message, if it sent one as {"error": ...}."""
    try:
        message = json.loads(response.body).get("error")
    except Exception:  # noqa: BLE001 - detail is optional
        return ""
    return f": {' '.join(str(message).split())[:200]}" if message else ""


class HttpTool:
    """Base of the clients: requests with one deadline, bounded retries, a response cap, an
    optional cache; never raises.

    Subclasses implement run(**arguments) -> text (raising ToolFailure or Truncated), and may
    override `cache_arguments` to fill in defaults before the cache key is computed."""

    name = "tool"
    default_path = ""  # appended to a bare-origin URL

    def __init__(
        self,
        url: str | None = None,
        policy: HttpPolicy | None = None,
        metrics: ToolMetrics | None = None,
        transport: HttpTransport | None = None,
        cache: ToolCache | None = None,
    ):
        """url: the endpoint (trusted: the address policy lets it through); None for tools that
        only fetch URLs given in the call (checked by the policy). transport: shared by the
        tools of one toolbox (its policy must allow their endpoints)."""
        self.url = endpoint_url(url, self.default_path) if url else None
        self.policy = policy or HttpPolicy()
        self.metrics = metrics or ToolMetrics()
        self.transport = transport or HttpTransport(AddressPolicy())
        if self.url:
            self.transport.policy.allow(self.url)
        self.cache = cache

    # ------------------------------------------------------------------ the call
    def __call__(self, **arguments) -> ToolResult:
        try:
            inspect.signature(self.run).bind(**arguments)
        except TypeError as e:  # a caller that skipped ToolBox validation
            result = ToolResult(f"Error: {self.name}: bad arguments ({e})", False, BAD_ARGUMENTS)
            self.metrics.record(self.name, result)
            return result
        key = self._cache_key(arguments)
        if key is not None:
            cached = self.cache.get(key)
            if cached is not None:
                text, truncated = cached
                result = self._finish(redaction.redact(text), truncated)
                self.metrics.record(self.name, result, cache_hit=True)
                return result
        try:
            text, truncated = self.run(**arguments), False
        except Truncated as t:
            text, truncated = t.text, True
        except ToolFailure as f:
            text = None
            result = ToolResult(f"Error: {self.name} failed: {f.message}", ok=False,
                                error_kind=f.kind)
        except Exception as e:  # noqa: BLE001 - a tool bug must not kill the rollout either
            log.exception("%s failed unexpectedly", self.name)
            text = None
            result = ToolResult(f"Error: {self.name} failed: {type(e).__name__}", False,
                                INTERNAL_ERROR)
        if text is not None:
            text = redaction.redact(text)  # before the cap: a key is never cut in half first
            result = self._finish(text, truncated)
            if key is not None:
                self.cache.put(key, text, truncated)
        else:
            result = dataclasses.replace(result, text=redaction.redact(result.text))
        self.metrics.record(self.name, result, cache_hit=None if key is None else False)
        return result

    def run(self, **arguments) -> str:
        raise NotImplementedError

    def cache_arguments(self, arguments: Mapping[str, Any]) -> Mapping[str, Any]:
        """The arguments as they decide the answer (subclasses fill in defaults)."""
        return arguments

    def _cache_key(self, arguments) -> str | None:
        if self.cache is None:
            return None
        service = f"{type(self).__name__}:{self.url or ''}"
        return cache_key(self.name, service, self.cache_arguments(arguments))

    def _finish(self, text: str, truncated: bool) -> ToolResult:
        cap = self.policy.max_chars
        if len(text) > cap:
            text, truncated = text[:cap], True
        if truncated:
            text += "\n[truncated]"
        return ToolResult(text, ok=True, truncated=truncated)

    # ------------------------------------------------------------------ HTTP
    def post(self, payload: dict, headers: Mapping[str, str] | None = None,
             url: str | None = None) -> Response:
        """POSTs JSON to the endpoint (or `url`); see request()."""
        body = json.dumps(payload, ensure_ascii=True).encode("ascii")
        headers = {"Content-Type": "application/json", "Accept": "application/json",
                   **dict(headers or {})}
        return self.request("POST", url or self.url, body=body, headers=headers)

    def request(self, method: str, url: str, body: bytes | None = None,
                headers: Mapping[str, str] | None = None) -> Response:
        """A 2xx response, retrying transient failures with exponential backoff, all within one
        deadline. Raises ToolFailure (4xx at once, the last failure once retries or time run out).
        """
        policy = self.policy
        deadline = time.monotonic() + policy.deadline_s
        limits = Limits(deadline=deadline, connect_timeout_s=policy.connect_timeout_s,
                        read_timeout_s=policy.read_timeout_s,
                        max_bytes=policy.max_response_bytes, max_redirects=policy.max_redirects)
        failure = ToolFailure(INTERNAL_ERROR, "no attempt made")
        for attempt in range(policy.max_retries + 1):
            if attempt:
                wait = policy.backoff_s * 2 ** (attempt - 1)
                if time.monotonic() + wait >= deadline:
                    break
                time.sleep(wait)
            try:
                response = self.transport.request(method, url, limits, body=body, headers=headers)
            except TransportError as e:
                failure = ToolFailure(e.kind, e.message)
                if e.retryable:
                    continue
                raise failure from None
            if response.status < 300:
                return response
            message = f"HTTP {response.status} from {_short(response.url)}"
            if _is_transient(response.status):
                failure = ToolFailure(SERVER_ERROR, message)
                continue
            if 300 <= response.status < 400:
                raise ToolFailure(BAD_RESPONSE, message + " (a redirect without a usable target)")
            raise ToolFailure(CLIENT_ERROR, message + _error_detail(response))
        raise failure


def _short(url: str) -> str:
    """A failing URL as the model reads it: host and path, or only the path for a loopback
    service. A local service's port is picked anew each run, and an error text that carried it
    made two runs of one seed see different tokens (the demo's workers open wrong page ids, each
    answered by a 404 naming the port) and so decode differently."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    ip = addresses.literal_ip(host)
    if (ip is not None and ip.is_loopback) or addresses.is_local_name(host):
        return f"the local service's {parts.path}"[:120]
    return f"{parts.netloc}{parts.path}"[:120]


def expect(condition: bool, what: str) -> None:
    if not condition:
        raise ToolFailure(BAD_RESPONSE, f"unexpected response format ({what})")
