"""What a run leaves in Redis for the run that takes its job over: the calls it made.

A job runs again when its worker died mid-job (another worker's reclaimer takes it over,
``gateway.queue.ownership.reclaim``) or handed it back at shutdown (``Worker.aclose``). The job's
one ledger row is written by the run that finishes it, and the runs before it are gone: without a
record of their calls, a hosted API's call they made is on the provider's invoice and not in the
ledger, and the vLLM work they did is booked to nobody. So a run keeps a note of its calls under
the request's key (``RedisKeys.run_note``: JSON, rewritten whole, expiring with the job's claim),
and a reclaimed run reads it before anything else and books those calls in its own row
(``Run.carried``). A handed-back job whose edge takes its claim before any worker takes it
over (its client left, or its deadline passed) is booked by that edge from the note, which it
reads in the claim's round trip (``gateway.queue.ownership.edge_booking``): once the edge holds the
claim no run can start, so the note is the whole story.

The note must cost the common path nothing (a job whose first call answers on its first run
writes none), so a run writes it only where it pays for a round trip already, or is on a slow
path:

- before a call to a hosted API is sent (from then on the provider bills it, whatever becomes of
  the worker): the call, in flight;
- when a call fails: the call, finished, with what it is booked (a retry, the next deployment or
  the error follows, each slower than one round trip);
- with a stream's first chunk, in the pipeline that sets its stream mark
  (``gateway.faults.marks``): the stream, in flight, with the usage its first chunk reported
  (vLLM's: the prompt exactly) and the content chunks relayed so far;
- when the worker hands the job back at shutdown: every call, the interrupted one booked as any
  cancelled call is (``gateway.accounting.estimates``).

Each note holds every call so far, the earlier runs' included, so the newest note is the whole
story. A call a note names as in flight is booked by the next run with outcome ``worker_lost``
(``estimates.interrupted``: a hosted API's from estimates, flagged; a vLLM call from the usage the
note kept, else no tokens). What no note names is a vLLM call started after the run's last note
(its first call, or a retry after a failure) and cut by the worker's death: such a call would be
booked no tokens anyway (vLLM aborts it when the dead worker's connections close, and a vLLM call
cut without usage is booked nothing), so the row's tokens and cost are the same; only that
attempt is missing from its list.

Redis errors are logged, never raised: a lost note loses what the next run could book, not the
job.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from backends.types import Usage
from gateway.accounting.estimates import INTERRUPTED, interrupted
from gateway.accounting.records import Attempt
from gateway.coalescer import Command
from gateway.queue.keys import RedisKeys
from gateway.queue.run import Run

__all__ = ["CallNotes", "InFlight", "NoRunNotes", "RunNote", "RunNotes", "parse_note"]

log = logging.getLogger(__name__)

_LOST = "in flight when its worker stopped; how it ended is unknown"


@dataclass(frozen=True, slots=True)
class InFlight:
    """A call that was in flight when its run's note was written."""

    deployment: str
    started: float
    """Unix time (s) the call started."""
    usage: Usage | None = None
    """The last usage its backend reported by then (a vLLM stream's first chunk), if any."""
    pieces: int = 0
    """Content chunks it had relayed to the client by then."""

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"deployment": self.deployment, "started": self.started}
        if self.usage is not None:
            data["usage"] = [self.usage.prompt_tokens, self.usage.completion_tokens]
        if self.pieces:
            data["pieces"] = self.pieces
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InFlight:
        usage = data.get("usage")
        return cls(
            deployment=str(data["deployment"]),
            started=float(data["started"]),
            usage=None if usage is None else Usage(int(usage[0]), int(usage[1])),
            pieces=int(data.get("pieces", 0)),
        )


@dataclass(frozen=True, slots=True)
class RunNote:
    """Every call of a job's runs so far, and the one in flight when it was written."""

    attempts: tuple[Attempt, ...]
    inflight: InFlight | None = None

    @classmethod
    def of(cls, run: Run, inflight: InFlight | None = None) -> RunNote:
        return cls(run.booked(), inflight)

    def encode(self) -> bytes:
        data: dict[str, Any] = {"attempts": [a.to_dict() for a in self.attempts]}
        if self.inflight is not None:
            data["inflight"] = self.inflight.to_dict()
        return orjson.dumps(data)

    @classmethod
    def decode(cls, raw: bytes) -> RunNote:
        """Raises ``ValueError`` (``orjson.JSONDecodeError``), ``KeyError`` or ``TypeError``
        on a malformed note."""
        data = orjson.loads(raw)
        inflight = data.get("inflight")
        return cls(
            tuple(Attempt.from_dict(a) for a in data["attempts"]),
            None if inflight is None else InFlight.from_dict(inflight),
        )

    def booked(
        self, body: Mapping[str, Any], *, external: Callable[[str], bool]
    ) -> tuple[Attempt, ...]:
        """The calls the next run books for the runs before it: the finished ones as they were
        booked, and the one in flight as ``worker_lost`` (``estimates.interrupted``; ``body``:
        the job's, for the prompt estimate of a hosted call; ``external``: whether a deployment
        is a hosted API). Its latency is unknown: 0."""
        call = self.inflight
        if call is None:
            return self.attempts
        usage, guess = interrupted(
            body, external=external(call.deployment), usage=call.usage, pieces=call.pieces
        )
        lost = Attempt(
            deployment=call.deployment,
            outcome=INTERRUPTED,
            latency_ms=0.0,
            prompt_tokens=usage.prompt_tokens if usage is not None else 0,
            completion_tokens=usage.completion_tokens if usage is not None else 0,
            error=_LOST,
            estimated=guess,
        )
        return (*self.attempts, lost)


class CallNotes(Protocol):
    """Where runs note their calls for a run that takes their job over (``RunNotes``)."""

    def command(self, run: Run, inflight: InFlight | None = None) -> Command | None: ...

    async def save(self, run: Run, inflight: InFlight | None = None) -> None: ...

    async def read(self, request_id: str) -> RunNote | None: ...


class NoRunNotes:
    """The ``CallNotes`` that keep nothing: a job run again books only its last run's calls."""

    def command(self, run: Run, inflight: InFlight | None = None) -> None:
        return None

    async def save(self, run: Run, inflight: InFlight | None = None) -> None:
        return None

    async def read(self, request_id: str) -> None:
        return None


class RunNotes:
    """Run notes in Redis; ``keep_s``: how long after its job's deadline a note is kept, the
    claim's time (a job is reclaimed while its claim lives: its note must live as long)."""

    def __init__(self, redis: aioredis.Redis, keys: RedisKeys, *, keep_s: int) -> None:
        self._redis = redis
        self._keys = keys
        self._keep_s = keep_s

    def _ttl_s(self, run: Run) -> int:
        return max(int(run.job.deadline - time.time()) + self._keep_s, self._keep_s)

    def command(self, run: Run, inflight: InFlight | None = None) -> Command:
        """The note of ``run`` now, as a command for a pipeline that goes to Redis anyway."""
        key = self._keys.run_note(run.job.request_id)
        value, ex = RunNote.of(run, inflight).encode(), self._ttl_s(run)
        return lambda pipe: pipe.set(key, value, ex=ex)

    async def save(self, run: Run, inflight: InFlight | None = None) -> None:
        """Write the note of ``run`` now (awaited: the caller goes on once it is in Redis)."""
        key = self._keys.run_note(run.job.request_id)
        try:
            await self._redis.set(key, RunNote.of(run, inflight).encode(), ex=self._ttl_s(run))
        except (RedisError, OSError) as exc:
            log.warning("cannot note the calls of %s: %r", run.job.request_id, exc)

    async def read(self, request_id: str) -> RunNote | None:
        """The last note of the runs before this one; ``None``: none (or unreadable, logged)."""
        try:
            raw: Any = await self._redis.get(self._keys.run_note(request_id))
        except (RedisError, OSError) as exc:
            log.warning("cannot read the calls noted for %s: %r", request_id, exc)
            return None
        return parse_note(raw, request_id)


def parse_note(raw: bytes | None, request_id: str) -> RunNote | None:
    """The note ``raw`` (a ``GET`` of ``RedisKeys.run_note``); ``None``: there is none, or it
    cannot be read (logged)."""
    if raw is None:
        return None
    try:
        return RunNote.decode(raw)
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("unreadable run note of %s: %r", request_id, exc)
        return None
