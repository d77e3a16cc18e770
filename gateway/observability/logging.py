"""Structured logs: one JSON object per line, carrying the request id of the request being served.

The request id lives in a ``ContextVar`` (``request_id_var``), set by the edge when a request
arrives; asyncio copies the context into the tasks a request starts, so every line logged on its
behalf carries it. ``log_request`` writes the one access line per answered request. Prompt and
answer text never reach a log line unless ``logging.log_prompts`` is set; the formatter emits only
the fields listed in ``_RESERVED``-free extras that callers pass explicitly.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any, Literal

import orjson

__all__ = [
    "JsonFormatter",
    "bind_request_id",
    "configure_logging",
    "log_request",
    "request_id_var",
]

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tiergate_request_id", default=None
)

ACCESS_LOGGER = "tiergate.access"

_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys() | {"message", "asctime"}
)


def bind_request_id(request_id: str) -> contextvars.Token[str | None]:
    return request_id_var.set(request_id)


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg", "request_id"?, **extra, "exc"?}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None) or request_id_var.get()
        if request_id:
            out["request_id"] = request_id
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and key not in out:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def configure_logging(
    level: int | str = logging.INFO, fmt: Literal["json", "text"] = "json"
) -> None:
    """Replace the root handlers with one stderr handler in ``fmt``."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def log_request(
    fields: Mapping[str, Any], *, prompt: Any = None, level: int = logging.INFO
) -> None:
    """The access line of one request. ``prompt`` is logged only when the caller passes it
    (the edge does so only with ``logging.log_prompts`` on)."""
    extra = dict(fields)
    if prompt is not None:
        extra["prompt"] = prompt
    logging.getLogger(ACCESS_LOGGER).log(level, "request", extra=extra)
