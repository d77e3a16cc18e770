"""A request's deadline, computed once at the edge: the planner's deadline spill-over reads the
time it leaves, and the request's job carries it, so both judge the same moment.

The timeout is ``x-tiergate-timeout-ms`` (or the same key in ``metadata``), else
``queue.default_timeout_ms``, at most ``queue.max_timeout_ms`` — and, for a non-streamed
request, never longer than the client will wait. The official OpenAI SDKs send their read
timeout on every request (``x-stainless-read-timeout``, seconds: ``600`` by default, ``5`` with
``OpenAI(timeout=5)``); a non-streamed request gets no byte back before its answer, so the
client gives up that long after sending it, and a job kept queued or running past that runs
for nobody. Such a request's timeout is therefore the shorter of the above and that read
timeout less a margin (``client_room_ms``). It only ever shortens: the SDK's default of 600 s
leaves the 120 s default as it is. A stream's read timeout bounds the gap between two chunks,
not the whole answer, so streamed requests ignore it. The header is the SDK's, not tiergate's:
a value that is not a positive finite number is ignored, never refused (unlike
``x-tiergate-timeout-ms``, which the client sets on purpose, ``RequestMeta.parse``), and one
under ``CLIENT_READ_TIMEOUT_MIN_S`` counts as that: ``1e-300`` would otherwise make a deadline
of 1 ms, a 504 before the request is even queued (a gateway error on the dashboards that the
client alone caused).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.api.meta import RequestMeta
from gateway.settings import QueueSettings

__all__ = [
    "CLIENT_MARGIN_MAX_S",
    "CLIENT_MARGIN_SHARE",
    "CLIENT_READ_TIMEOUT",
    "CLIENT_READ_TIMEOUT_MIN_S",
    "RequestDeadline",
    "client_read_timeout_s",
    "client_room_ms",
    "request_timeout_ms",
]

CLIENT_READ_TIMEOUT = "x-stainless-read-timeout"
"""The OpenAI SDK's header (lower-case, as the edge's header mappings have them)."""
CLIENT_READ_TIMEOUT_MIN_S = 1.0
"""A shorter read timeout counts as this (a deadline of 0.9 s): no model answers sooner."""
CLIENT_MARGIN_SHARE = 0.1
CLIENT_MARGIN_MAX_S = 1.0
"""The deadline ends this much before the client gives up: 10 % of its read timeout, at most
1 s. The client's clock starts before the edge's (the request's upload, authentication) and the
504 reaches it after the edge's deadline (the edge's wake-up, a worker's reply through Redis, a
busy event loop, the way back), so without a margin the client's timer always fires first: it
raises its own timeout instead of reading the 504, and the gateway books a disconnect. A second
covers those delays many times over (the edge's added p99 at concurrency 64 is under 0.2 s,
README "Performance"); the share keeps a short timeout useful (1 s leaves 0.9 s). A larger
margin would refuse or spill work that could still have been answered in time."""


def client_read_timeout_s(headers: Mapping[str, str]) -> float | None:
    """The client's read timeout (s) from ``x-stainless-read-timeout``, at least
    ``CLIENT_READ_TIMEOUT_MIN_S``; ``None`` when absent or not a positive finite number."""
    raw = headers.get(CLIENT_READ_TIMEOUT)
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        return None
    if not (math.isfinite(seconds) and seconds > 0):
        return None
    return max(seconds, CLIENT_READ_TIMEOUT_MIN_S)


def client_room_ms(headers: Mapping[str, str], *, stream: bool) -> float | None:
    """How long (ms) a non-streamed request's client waits for its answer, less the margin;
    ``None``: streamed, or no usable ``x-stainless-read-timeout``."""
    seconds = None if stream else client_read_timeout_s(headers)
    if seconds is None:
        return None
    margin = min(seconds * CLIENT_MARGIN_SHARE, CLIENT_MARGIN_MAX_S)
    return (seconds - margin) * 1000


def request_timeout_ms(
    meta: RequestMeta, queue: QueueSettings, *, headers: Mapping[str, str], stream: bool
) -> int:
    """``x-tiergate-timeout-ms`` (or ``metadata``), else ``queue.default_timeout_ms``; at most
    ``queue.max_timeout_ms``, and at most ``client_room_ms`` (never below 1 ms)."""
    timeout_ms = min(meta.timeout_ms or queue.default_timeout_ms, queue.max_timeout_ms)
    room_ms = client_room_ms(headers, stream=stream)
    if room_ms is not None and room_ms < timeout_ms:
        timeout_ms = max(1, int(room_ms))
    return timeout_ms


@dataclass(frozen=True, slots=True)
class RequestDeadline:
    timeout_ms: int
    at: float
    """Unix time (s): the request's arrival plus its timeout."""

    @classmethod
    def of(
        cls,
        meta: RequestMeta,
        queue: QueueSettings,
        received_at: float,
        *,
        headers: Mapping[str, str],
        stream: bool,
    ) -> RequestDeadline:
        timeout_ms = request_timeout_ms(meta, queue, headers=headers, stream=stream)
        return cls(timeout_ms, received_at + timeout_ms / 1000)

    def left_s(self, now: float) -> float:
        """Seconds from ``now`` to the deadline (negative once it has passed)."""
        return self.at - now
