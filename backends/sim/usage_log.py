"""The usage log: one JSON line per chat request served, errors included.

Fields: ``ts`` (Unix seconds, float), ``request_id`` (the ``x-request-id`` header, else generated),
``model`` (the served model id), ``stream``, ``status`` (the HTTP status sent), ``prompt_tokens``
and ``completion_tokens`` (as reported to the client, or as far as a cut stream got; 0 when the
request was refused before counting), ``finish_reason`` (``stop``/``length``; ``abort`` when the
client left — a non-streamed one too, as vLLM aborts it — or a fault cut the answer or made it
unreadable; null for errors) and ``fault`` (the injected fault that
answered with an error or cut the answer, or null). For a cut answer ``completion_tokens`` is
what the engine generated before the cut (sent, for a stream). ``cached_tokens``: the prompt
tokens found in the prefix cache (no prefill for them; 0 with caching off or before a slot).

The file is opened once, in append mode, and each line is flushed as it is written: a small
buffered write per request, cheap enough for the event loop, and complete lines for a test that
reads the file while the simulator runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import orjson

__all__ = ["UsageLog", "UsageRecord"]


@dataclass(frozen=True, slots=True)
class UsageRecord:
    request_id: str
    model: str
    stream: bool
    status: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: str | None = None
    fault: str | None = None


class UsageLog:
    """Appends ``UsageRecord`` lines to ``path``; a no-op when ``path`` is None."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._file: BinaryIO | None = None

    def open(self) -> None:
        if self._path is not None and self._file is None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self._path.open("ab")

    def write(self, record: UsageRecord) -> None:
        if self._file is None:
            return
        line = {
            "ts": round(time.time(), 6),
            "request_id": record.request_id,
            "model": record.model,
            "stream": record.stream,
            "status": record.status,
            "prompt_tokens": record.prompt_tokens,
            "completion_tokens": record.completion_tokens,
            "cached_tokens": record.cached_tokens,
            "finish_reason": record.finish_reason,
            "fault": record.fault,
        }
        self._file.write(orjson.dumps(line) + b"\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
