"""The ledger sink: drains the ledger event stream into SQL (at least once in, once out).

Each sink process reads as its own consumer of the group and acknowledges a batch only after it
is committed. A sink that dies leaves its read-but-unacknowledged events pending under its
name; every sink claims such events once they have been idle ``claim_idle_ms`` (``XAUTOCLAIM``)
and books them, so a crashed sink loses nothing, and the idempotent ledger books nothing twice."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError
from sqlalchemy.exc import SQLAlchemyError

from gateway.accounting.events import decode_entry
from gateway.accounting.records import Ledger, LedgerEntry
from gateway.queue.streams import StreamEntry, stream_entries
from gateway.tasks import stop_task

__all__ = ["LedgerSink"]

log = logging.getLogger(__name__)

_BATCH = 256
"""Most events written in one transaction."""


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
        claim_idle_ms: int = 30_000,
        linger_s: float = 0.1,
    ) -> None:
        """``linger_s``: after the first event of a batch arrives, how long to wait for more
        before writing (one SQL transaction per batch, not per request; the events are safe in
        the stream meanwhile)."""
        self._redis = redis
        self._blocking = blocking_redis
        self._stream = stream
        self._group = group
        self._consumer = consumer
        self._ledger = ledger
        self._claim_idle_ms = claim_idle_ms
        self._linger_s = linger_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="tiergate-ledger-sink")

    async def aclose(self) -> None:
        if self._task is not None:
            # Give in-flight entries a moment to land before stopping.
            with contextlib.suppress(RedisError, OSError, SQLAlchemyError):
                await asyncio.wait_for(self.drain(), timeout=5)
            await stop_task(self._task)
            self._task = None

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

    async def _run(self) -> None:
        backoff = 0.1
        pending_first = True
        while True:
            try:
                if pending_first:
                    await self._ensure_group()
                start = "0" if pending_first else ">"
                response = await self._blocking.xreadgroup(
                    self._group, self._consumer, {self._stream: start}, count=_BATCH, block=1000
                )
                entries = stream_entries(response)
                if pending_first and not entries:
                    pending_first = False
                    await self._claim_abandoned()
                    continue
                if entries:
                    if not pending_first:
                        entries += await self._more(len(entries))
                    await self._write(entries)
                else:
                    await self._claim_abandoned()
                backoff = 0.1
            except (RedisError, OSError, SQLAlchemyError) as exc:
                log.warning("ledger sink paused: %s", type(exc).__name__)
                pending_first = True
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

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
        twice (the ledger is idempotent by request id); a malformed one is logged and dropped."""
        decoded: list[LedgerEntry] = []
        for entry_id, fields in entries:
            try:
                entry = decode_entry(fields[b"e"])
                if entry.created_at.tzinfo is None:
                    raise ValueError("created_at has no timezone")
            except (KeyError, ValueError, TypeError) as exc:
                log.error("dropping malformed ledger event %s: %s", entry_id, exc)
                continue
            decoded.append(entry)
        if decoded:
            await self._ledger.record_many(decoded)
        ids = [entry_id for entry_id, _fields in entries]
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.xack(self._stream, self._group, *ids)
            pipe.xdel(self._stream, *ids)
            await pipe.execute()
        return len(decoded)
