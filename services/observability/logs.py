"""The service's log lines: plain text by default, one JSON object per line with ``PBE_LOG_FORMAT=json``, and in
both the evaluation, task and attempt of the session or grading a line was written for.

``log_context(evaluation=..., task=..., attempt=...)`` marks the lines written inside it (context variables, so
each of an executor's session threads carries its own); ``configure_logging`` installs the format on the root
logger of a process (the gateway, a worker).
"""

import contextlib
import contextvars
import json
import logging
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

LOG_FORMAT_VARIABLE = "PBE_LOG_FORMAT"
"""``json`` for JSON lines; anything else (or unset) for text."""

_FIELDS = ("evaluation", "task", "attempt")
_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("pbe_log_context", default=None)


@contextlib.contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Mark every line logged inside with ``fields`` (``evaluation``, ``task``, ``attempt``), on top of any outer
    context's."""
    token = _context.set({**(_context.get() or {}), **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


class ContextFilter(logging.Filter):
    """Puts the current ``log_context`` on each record (as attributes, None where unset)."""

    def filter(self, record: logging.LogRecord) -> bool:
        current = _context.get() or {}
        for name in _FIELDS:
            setattr(record, name, current.get(name))
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the context's fields, and the exception if any."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in _FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """``time level logger: message [evaluation=... task=... attempt=...]``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        marks = " ".join(f"{n}={getattr(record, n)}" for n in _FIELDS if getattr(record, n, None) is not None)
        return f"{text} [{marks}]" if marks else text


def configure_logging(log_format: str | None = None, level: int | str = logging.INFO) -> logging.Handler:
    """Send the process's log lines to stderr in ``log_format`` (default: ``$PBE_LOG_FORMAT``), replacing the
    handler an earlier call installed. Returns the handler."""
    chosen = (log_format if log_format is not None else os.environ.get(LOG_FORMAT_VARIABLE, "")).strip().lower()
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if chosen == "json" else TextFormatter())
    handler.addFilter(ContextFilter())
    handler.set_name("pybench-eval")
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "pybench-eval"]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    return handler
