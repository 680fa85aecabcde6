"""Structured logs: JSON lines (or plain text) carrying the request, job, placement, provider and offering.

Contract:
- `log_context(**fields)` binds context fields (`request_id`, `tick_id`, `job_id`, `placement_id`, `provider`,
  `offering`) for the code inside it, in the current thread or task only (contextvars), and restores the previous
  values on exit. Every record logged inside carries the fields that are set; unset fields are left out.
  `bind(**fields)` sets fields without a block, for loops over jobs; an enclosing `log_scope()` (the tick puts
  one around every step) restores the previous values on exit.
- `JsonFormatter` writes one JSON object per line: `ts` (UTC, ISO 8601), `level`, `logger`, `message`, the bound
  context, any `extra={...}` fields, and `exc` for exceptions.
- Every formatter here redacts before writing: API keys (`ovs_<id>_<secret>` keeps only `ovs_<id>_***`),
  `Authorization`/`Bearer` credentials, and the configured secrets (`secrets=`) wherever they appear, including in
  exception text. A secret is never written, whatever a caller passes in.
- `configure_logging(settings)` installs one stderr handler on the root logger with the format and level the
  settings choose (`OVERSPILL_LOG_FORMAT=auto|json|text`, `OVERSPILL_LOG_LEVEL`). Calling it again replaces it.
  `auto` (the default) writes text when the stream is a terminal and JSON lines otherwise.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import traceback
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker.config.settings import Settings

CONTEXT_FIELDS = ("request_id", "tick_id", "job_id", "placement_id", "provider", "offering")
_context: dict[str, contextvars.ContextVar[str | None]] = {
    name: contextvars.ContextVar(f"overspill_log_{name}", default=None) for name in CONTEXT_FIELDS
}

_API_KEY = re.compile(r"\b(ovs_[A-Za-z0-9]+_)[A-Za-z0-9_\-]{8,}")
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=\-]+")
_AUTH_HEADER = re.compile(r"(?i)((?:authorization|x-api-key|proxy-authorization)['\"]?\s*[:=]\s*['\"]?)[^'\",}\s]+")
_STANDARD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


@contextmanager
def log_context(**fields: str | None) -> Iterator[None]:
    """Bind context fields for the records logged inside; `None` values leave a field as it was."""
    tokens = []
    for name, value in fields.items():
        if name not in _context:
            raise ValueError(f"unknown log context field {name!r} (one of {', '.join(CONTEXT_FIELDS)})")
        if value is not None:
            tokens.append((_context[name], _context[name].set(str(value))))
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


@contextmanager
def log_scope() -> Iterator[None]:
    """Undo on exit whatever `bind` set inside: wrap a loop step, and bind per item inside it."""
    saved = {name: var.get() for name, var in _context.items()}
    try:
        yield
    finally:
        for name, value in saved.items():
            _context[name].set(value)


def bind(**fields: str | None) -> None:
    """Set context fields (`None` clears one) until the enclosing `log_scope` ends."""
    for name, value in fields.items():
        if name not in _context:
            raise ValueError(f"unknown log context field {name!r} (one of {', '.join(CONTEXT_FIELDS)})")
        _context[name].set(None if value is None else str(value))


def current_context() -> dict[str, str]:
    """The context fields bound here and now."""
    return {name: value for name, var in _context.items() if (value := var.get()) is not None}


class Redactor:
    """Removes credentials from text: API keys, bearer tokens, auth headers and the given literal secrets."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets = sorted({s for s in secrets if s and len(s) >= 6}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, "***")
        text = _API_KEY.sub(r"\1***", text)
        text = _BEARER.sub(r"\1 ***", text)
        return _AUTH_HEADER.sub(r"\1***", text)


class _RedactingFormatter(logging.Formatter):
    def __init__(self, redact: Redactor, fmt: str | None = None) -> None:
        super().__init__(fmt)
        self.redact = redact

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(_RedactingFormatter):
    """One JSON object per record, redacted; see the module docstring for the fields."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__(Redactor(secrets))

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": self.formatTime(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        out.update(current_context())
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        return self.redact(json.dumps(out, default=str, ensure_ascii=False))


class TextFormatter(_RedactingFormatter):
    """`ts level logger message key=value...` for people reading a terminal; redacted like the JSON form."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__(Redactor(secrets), "%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = " ".join(f"{k}={v}" for k, v in current_context().items())
        return self.redact(f"{line} {context}" if context else line)


def configured_secrets(settings: Settings) -> list[str]:
    """Every secret the settings hold, so no log line can carry one even by accident."""
    return [
        s
        for s in (
            settings.bootstrap_api_key,
            settings.callback_secret,
            settings.libcloud_secret,
            settings.libcloud_key,
            settings.metrics_token,
            settings.slurm_jwt,
        )
        if s
    ]


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever `sys.stderr` is at each record (it may be swapped, e.g. by a test runner)."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr


def resolved_format(setting: str, stream: Any) -> str:
    """`json` or `text`: the setting when it names one; for `auto`, text on a terminal and JSON otherwise (a file,
    a pipe, a log collector)."""
    if setting in ("json", "text"):
        return setting
    try:
        return "text" if stream.isatty() else "json"
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return "json"


def configure_logging(settings: Settings, stream: Any = None, *, level: str | None = None) -> logging.Handler:
    """Send every record to stderr (or `stream`) in the configured format, at the configured level (or `level`);
    returns the installed handler. Alembic's start-up chatter is kept at WARNING."""
    formatter: logging.Formatter
    if resolved_format(settings.log_format, stream if stream is not None else sys.stderr) == "json":
        formatter = JsonFormatter(configured_secrets(settings))
    else:
        formatter = TextFormatter(configured_secrets(settings))
    handler = logging.StreamHandler(stream) if stream is not None else _StderrHandler()
    handler.setFormatter(formatter)
    handler.set_name("overspill")
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "overspill"]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel((level or settings.log_level).upper())
    logging.getLogger("alembic").setLevel(logging.WARNING)
    return handler
