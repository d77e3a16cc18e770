"""Structured logs: one JSON object per line, carrying the request id of the request being served.

The request id lives in a ``ContextVar`` (``request_id_var``), set by the edge when a request
arrives; asyncio copies the context into the tasks a request starts, so every line logged on its
behalf carries it. ``log_request`` writes the one access line per answered request. Prompt and
answer text never reach a log line unless ``logging.log_prompts`` is set; the formatter emits only
the fields listed in ``_RESERVED``-free extras that callers pass explicitly.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import logging
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any, Literal, TextIO

import orjson

__all__ = [
    "BackgroundStreamHandler",
    "JsonFormatter",
    "bind_request_id",
    "configure_logging",
    "log_request",
    "new_request_id",
    "request_id_var",
]

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tiergate_request_id", default=None
)

ACCESS_LOGGER = "tiergate.access"

_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys() | {"message", "asctime"}
)


def new_request_id() -> str:
    """A request id: ``req_`` and 32 hex digits (the ledger row's key for a chat request)."""
    return f"req_{uuid.uuid4().hex}"


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


_LINGER_S = 0.05
"""How long the writer gathers lines after the first one wakes it."""


class BackgroundStreamHandler(logging.Handler):
    """Formats on the caller's thread, writes on its own: the event loop never blocks on a full
    pipe to a log collector. The writer wakes at most once per ``linger_s`` while lines keep
    coming, and writes what gathered meanwhile in one write: a line costs its caller an append,
    not a thread wake-up (whose contention for the GIL would land on the event loop).
    ``flush`` and ``close`` (``logging.shutdown`` at exit) write what is left at once."""

    def __init__(self, stream: TextIO, *, linger_s: float = _LINGER_S) -> None:
        super().__init__()
        self._stream = stream
        self._linger_s = linger_s
        self._lines: collections.deque[str | threading.Event | None] = collections.deque()
        self._signalled = False
        self._wake = threading.Event()
        self._now = threading.Event()
        self._lock_writer = threading.Lock()
        self._writer = self._start_writer()

    def _start_writer(self) -> threading.Thread:
        writer = threading.Thread(target=self._write, name="tiergate-log", daemon=True)
        writer.start()
        return writer

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if not self._writer.is_alive():
                if sys.is_finalizing():
                    # A finalizer logging after ``logging.shutdown``: a thread started now
                    # never runs (and ``start`` waits for it forever), so write here.
                    self._write_now(self.format(record))
                    return
                # Closed and still in use: ``logging.config.dictConfig`` (uvicorn calls it at
                # start-up) closes every existing handler. Start writing again.
                with self._lock_writer:
                    if not self._writer.is_alive():
                        self._writer = self._start_writer()
            self._put(self.format(record))
        except Exception:  # noqa: BLE001 - logging's contract: a bad record never raises
            self.handleError(record)

    def _put(self, item: str | threading.Event | None, *, now: bool = False) -> None:
        self._lines.append(item)
        if now:
            self._now.set()
        if now or not self._signalled:
            self._signalled = True
            self._wake.set()

    def _write(self) -> None:
        while True:
            self._wake.wait()
            self._now.wait(self._linger_s)  # gather more lines, unless asked to write now
            self._wake.clear()
            self._now.clear()
            self._signalled = False  # a line added from here on wakes the writer again
            batch: list[str] = []
            while True:
                try:
                    item = self._lines.popleft()
                except IndexError:
                    item = ""
                    break
                if not isinstance(item, str):
                    break
                batch.append(item)
            if batch:
                self._write_now("\n".join(batch))
            if isinstance(item, threading.Event):
                item.set()  # a flush: everything before it is written
                self._wake.set()  # lines after it may wait in the deque
            elif item is None:
                return

    def _write_now(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._stream.write(text + "\n")
            self._stream.flush()

    def flush(self) -> None:
        """Wait until every line emitted so far is written."""
        if self._writer.is_alive():
            done = threading.Event()
            self._put(done, now=True)
            done.wait(timeout=5.0)

    def close(self) -> None:
        if self._writer.is_alive():
            self._put(None, now=True)
            self._writer.join(timeout=5.0)
        super().close()


def configure_logging(
    level: int | str = logging.INFO,
    fmt: Literal["json", "text"] = "json",
    *,
    stream: TextIO | None = None,
) -> None:
    """Replace the root handlers with one handler in ``fmt`` writing to ``stream`` (default
    stderr) in the background (``BackgroundStreamHandler``)."""
    for old in logging.getLogger().handlers:
        if isinstance(old, BackgroundStreamHandler):
            old.close()
    handler = BackgroundStreamHandler(stream if stream is not None else sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Alembic narrates every plugin and revision (each revision's docstring, over several
    # lines) at INFO; ``gateway.accounting.migrate`` says in one line what a start migrated.
    logging.getLogger("alembic").setLevel(max(logging.WARNING, root.level))


def log_request(
    fields: Mapping[str, Any], *, prompt: Any = None, level: int = logging.INFO
) -> None:
    """The access line of one request. ``prompt`` is logged only when the caller passes it
    (the edge does so only with ``logging.log_prompts`` on)."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if not logger.isEnabledFor(level):
        return
    extra = dict(fields)
    if prompt is not None:
        extra["prompt"] = prompt
    # The record is made here rather than by ``Logger.log``, which would first walk the stack
    # for the caller's file and line (``findCaller``): no formatter of ours prints them, and the
    # walk was an eighth of the access line's cost.
    logger.handle(logger.makeRecord(ACCESS_LOGGER, level, "", 0, "request", (), None, extra=extra))
