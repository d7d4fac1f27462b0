"""Known secret values kept out of every text the model or a log sees.

The clients read their API keys from environment variables the config names (tools.api_key_env,
tools.reader_key_env, reward.judge_api_key_env) and register those names here. A service that
echoes the key (an error body "invalid key sk-...", a page showing the request) would otherwise
put it into the model's context, the saved transcripts and the logs. Values are read from the
environment at each use, so a key set after start-up is covered too.
"""
from __future__ import annotations

import logging
import os
import threading

REDACTED = "[redacted]"
MIN_SECRET_CHARS = 8  # shorter values ("1", "test") would blank ordinary words

_names: set[str] = set()
_lock = threading.Lock()
_factory_installed = False


def register(*env_names: str | None) -> None:
    """Names of environment variables holding secrets; their values are redacted from then on
    (tool texts through `redact`, every log record through the record factory)."""
    global _factory_installed
    with _lock:
        _names.update(name for name in env_names if name)
        if not _factory_installed:
            _install_record_factory()
            _factory_installed = True


def known_secrets() -> list[str]:
    """The registered variables' current values, longest first (a key containing another is
    replaced whole)."""
    values = {os.environ.get(name, "") for name in tuple(_names)}
    return sorted((v for v in values if len(v) >= MIN_SECRET_CHARS), key=len, reverse=True)


def redact(text: str) -> str:
    for secret in known_secrets():
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def _install_record_factory() -> None:
    """Every log record, of every logger and handler, is formatted and redacted as it is made
    (a filter on one logger would miss records propagated from others)."""
    previous = logging.getLogRecordFactory()

    def factory(*args, **kwargs):
        record = previous(*args, **kwargs)
        if not known_secrets():
            return record
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string: logging reports it later
            return record
        record.msg, record.args = redact(message), None
        if record.exc_info:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return record

    logging.setLogRecordFactory(factory)
