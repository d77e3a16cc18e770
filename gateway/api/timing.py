"""Where a request's time went, as a standard ``Server-Timing`` response header.

Stages of the edge (``auth``, ``parse``, ``route``, ``limits``, ``relay``) are measured here;
``queue`` (waiting for a worker) and ``backend`` (the model's time) come from the worker's reply,
and ``worker`` is the rest of the time the job spent in the worker (breaker checks, accounting,
the hand-back). ``total`` is from the start of authentication to the response.
"""

from __future__ import annotations

import time

from gateway.reply_meta import ReplyMeta

__all__ = ["StageClock"]


class StageClock:
    __slots__ = ("_last", "_stages", "started")

    def __init__(self, started: float, *, auth_s: float = 0.0) -> None:
        """``started``: ``perf_counter()`` when the handler began; ``auth_s``: time spent
        authenticating before it."""
        self.started = started
        self._last = started
        self._stages: dict[str, float] = {"auth": auth_s} if auth_s else {}

    def lap(self, stage: str) -> None:
        """Charge the time since the previous lap to ``stage``."""
        now = time.perf_counter()
        self._stages[stage] = self._stages.get(stage, 0.0) + now - self._last
        self._last = now

    def header(self, meta: ReplyMeta) -> str:
        """The ``Server-Timing`` value, once the reply (with the worker's ``meta``) is in."""
        self.lap("relay")
        queue_s = meta.queue_ms / 1000
        backend_s = (meta.backend_ms or 0.0) / 1000
        stages = dict(self._stages)
        waited = stages.pop("wait", 0.0)
        # The worker's figures, fitted into the time the edge waited (its clock is the judge).
        backend_s = min(backend_s, waited)
        queue_s = min(queue_s, waited - backend_s)
        worker_s = waited - queue_s - backend_s
        stages.update(queue=queue_s, backend=backend_s, worker=worker_s)
        total = self._last - self.started + self._stages.get("auth", 0.0)
        stages["total"] = total
        return ", ".join(f"{name};dur={seconds * 1000:.3f}" for name, seconds in stages.items())
