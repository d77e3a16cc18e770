"""The ledger sink: drains the ledger event stream into SQL (at least once in, once out).

Each sink process reads as its own consumer of the group and acknowledges a batch only after it
is committed. A sink that dies leaves its read-but-unacknowledged events pending under its
name; every sink claims such events once they have been idle ``claim_idle_ms`` (``XAUTOCLAIM``)
and books them, so a crashed sink loses nothing, and the idempotent ledger books nothing twice.

An event the ledger cannot book — one it cannot decode, or one SQL refuses for what it holds —
is set aside as a dead letter (``gateway.accounting.dead_letters``) and acknowledged, so one bad
event never holds back the events behind it. Only the database being away pauses the sink.
``state`` says which of the two it is doing, for ``/readyz``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError
from redis.typing import EncodableT, FieldT
from sqlalchemy.exc import SQLAlchemyError
from tenacity import wait_exponential

from gateway.accounting.dead_letters import WRITE_ERRORS, DeadLetter, DeadLetters, is_poison
from gateway.accounting.events import decode_entry
from gateway.accounting.records import Ledger, LedgerEntry
from gateway.loops import Loop
from gateway.queue.client.streams import StreamEntry, stream_entries

__all__ = ["LedgerSink"]

log = logging.getLogger(__name__)

_BATCH = 256
"""Most events written in one transaction."""

_DEAD_LETTERS_KEPT = 100_000
"""The dead-letter stream is trimmed to about this many entries (SQL keeps every one)."""


def _uncounted(reason: str) -> None:
    """The default ``on_dead_letter``: counts nothing."""


class LedgerSink:
    def __init__(
        self,
        *,
        redis: aioredis.Redis,
        blocking_redis: aioredis.Redis,
        stream: str,
        group: str,
        consumer: str,
        ledger: Ledger,
        dead_letters: DeadLetters,
        dead_letter_stream: str,
        on_dead_letter: Callable[[str], None] = _uncounted,
        claim_idle_ms: int = 30_000,
        linger_s: float = 0.1,
        block_ms: int = 1000,
    ) -> None:
        """``linger_s``: after the first event of a batch arrives, how long to wait for more
        before writing (one SQL transaction per batch, not per request; the events are safe in
        the stream meanwhile). ``on_dead_letter(kind)`` is told of each event set aside
        (``malformed`` or ``refused``). ``block_ms``: how long one read waits for events
        (``gateway.queue.client.connection.BLOCKING_READ_S``; its client times out after)."""
        self._redis = redis
        self._blocking = blocking_redis
        self._stream = stream
        self._group = group
        self._consumer = consumer
        self._ledger = ledger
        self._dead_letters = dead_letters
        self._dead_letter_stream = dead_letter_stream
        self._on_dead_letter = on_dead_letter
        self._state = "starting"
        self._claim_idle_ms = claim_idle_ms
        self._linger_s = linger_s
        self._block_ms = block_ms
        self._pending_first = True
        """Read this consumer's own pending entries first (at start, and after an error)."""
        self._loop = Loop(  # reads block on the stream: no pause between them
            "tiergate-ledger-sink",
            self._consume,
            every_s=0,
            catch=(RedisError, OSError, *WRITE_ERRORS),
            on_error=self._paused,
            backoff=wait_exponential(multiplier=0.1, max=2.0),
        )

    @property
    def state(self) -> str:
        """``ok``, ``starting``, or ``paused: <error>`` while the database or Redis is away."""
        return self._state

    def start(self) -> None:
        self._loop.start()

    async def aclose(self) -> None:
        if self._loop.started:
            # Give in-flight entries a moment to land before stopping.
            with contextlib.suppress(RedisError, OSError, SQLAlchemyError):
                await asyncio.wait_for(self.drain(), timeout=5)
        await self._loop.aclose()

    async def drain(self) -> int:
        """Write everything queued now (own pending entries first). Returns entries written."""
        await self._ensure_group()
        written = 0
        for start in ("0", ">"):
            while True:
                response = await self._redis.xreadgroup(
                    self._group, self._consumer, {self._stream: start}, count=_BATCH
                )
                entries = stream_entries(response)
                if not entries:
                    break
                written += await self._write(entries)
                if start == "0":
                    break
        return written + await self._claim_abandoned()

    async def _ensure_group(self) -> None:
        try:
            await self._redis.xgroup_create(self._stream, self._group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def _consume(self) -> None:
        """One read of the stream and the write of what it brought."""
        pending_first = self._pending_first
        if pending_first:
            await self._ensure_group()
        start = "0" if pending_first else ">"
        response = await self._blocking.xreadgroup(
            self._group, self._consumer, {self._stream: start}, count=_BATCH, block=self._block_ms
        )
        entries = stream_entries(response)
        if pending_first and not entries:
            self._pending_first = False
            await self._claim_abandoned()
            return
        if entries:
            if not pending_first:
                entries += await self._more(len(entries))
            await self._write(entries)
        else:
            await self._claim_abandoned()
        self._state = "ok"

    def _paused(self, exc: BaseException) -> None:
        """Tried again after a pause growing to 2 s, own pending entries first."""
        self._state = f"paused: {type(exc).__name__}"
        log.warning("ledger sink paused: %s: %s", type(exc).__name__, exc)
        self._pending_first = True

    async def _more(self, have: int) -> list[StreamEntry]:
        """What else arrives within the linger time, up to a full batch."""
        if have >= _BATCH or self._linger_s <= 0:
            return []
        await asyncio.sleep(self._linger_s)
        response = await self._redis.xreadgroup(
            self._group, self._consumer, {self._stream: ">"}, count=_BATCH - have
        )
        return stream_entries(response)

    async def _claim_abandoned(self) -> int:
        """Book events another (dead) consumer read but never acknowledged."""
        written = 0
        start = "0-0"
        while True:
            reply = await self._redis.xautoclaim(
                self._stream, self._group, self._consumer, self._claim_idle_ms, start, count=_BATCH
            )
            start = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
            entries = [(eid, fields) for eid, fields in reply[1] if fields]
            if entries:
                written += await self._write(entries)
            if start == "0-0" or not reply[1]:
                return written

    async def _write(self, entries: list[StreamEntry]) -> int:
        """Book a batch in one transaction, then acknowledge it. A replayed entry is not booked
        twice (the ledger is idempotent by request id); one that cannot be decoded or that SQL
        refuses is set aside as a dead letter (and acknowledged too)."""
        now = datetime.now(UTC)
        decoded: list[tuple[str, bytes, LedgerEntry]] = []
        letters: list[DeadLetter] = []
        for stream_id, fields in entries:
            entry_id = stream_id.decode()
            raw = fields.get(b"e")
            try:
                if raw is None:
                    raise KeyError("the event has no 'e' field")
                entry = decode_entry(raw)
                if entry.created_at.tzinfo is None:
                    raise ValueError("created_at has no timezone")
            except (KeyError, ValueError, TypeError) as exc:
                letters.append(DeadLetter.of(entry_id, raw, f"malformed: {exc}", now))
                continue
            decoded.append((entry_id, raw, entry))
        refused = await self._book(decoded, now)
        if letters or refused:
            await self._set_aside(letters, refused)
        ids = [entry_id for entry_id, _fields in entries]
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.xack(self._stream, self._group, *ids)
            pipe.xdel(self._stream, *ids)
            await pipe.execute()
        return len(decoded) - len(refused)

    async def _book(
        self, decoded: list[tuple[str, bytes, LedgerEntry]], now: datetime
    ) -> list[DeadLetter]:
        """Book the entries in one transaction; when SQL refuses the batch for what it holds,
        book them one by one and return the dead letters of those refused on their own. Any
        other failure (the database is away) propagates: nothing is acknowledged."""
        if not decoded:
            return []
        try:
            await self._ledger.record_many([entry for _id, _raw, entry in decoded])
            return []
        except WRITE_ERRORS as exc:
            if not is_poison(exc):
                raise
        refused: list[DeadLetter] = []
        for entry_id, raw, entry in decoded:
            try:
                await self._ledger.record_many([entry])
            except WRITE_ERRORS as exc:
                if not is_poison(exc):
                    raise
                reason = f"refused by SQL: {type(exc).__name__}: {exc}".splitlines()[0]
                refused.append(DeadLetter.of(entry_id, raw, reason, now))
        return refused

    async def _set_aside(self, malformed: list[DeadLetter], refused: list[DeadLetter]) -> None:
        """Keep the dead letters in SQL, then in the dead-letter stream (before the caller
        acknowledges their events), and count and log each."""
        letters = [*malformed, *refused]
        await self._dead_letters.record(letters)
        async with self._redis.pipeline(transaction=False) as pipe:
            for letter in letters:
                fields: dict[FieldT, EncodableT] = dict(letter.stream_fields().items())
                pipe.xadd(
                    self._dead_letter_stream,
                    fields,
                    maxlen=_DEAD_LETTERS_KEPT,
                    approximate=True,
                )
            await pipe.execute()
        for kind, group in (("malformed", malformed), ("refused", refused)):
            for letter in group:
                self._on_dead_letter(kind)
                log.error(
                    "ledger event %s (request %s) set aside as a dead letter: %s",
                    letter.stream_id,
                    letter.request_id,
                    letter.reason,
                )
