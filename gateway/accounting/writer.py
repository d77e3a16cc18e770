"""How entries reach the ledger: through a Redis stream the sink drains into SQL, or straight
into SQL when Redis cannot take them. The ledger is idempotent by request id, so an entry that
travels both ways is still booked once."""

from __future__ import annotations

import logging

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

from gateway.accounting.events import encode_entry
from gateway.accounting.records import Ledger, LedgerEntry

__all__ = ["LedgerWriter"]

log = logging.getLogger(__name__)


class LedgerWriter:
    def __init__(self, redis: aioredis.Redis, stream: str, ledger: Ledger) -> None:
        self._redis = redis
        self._stream = stream
        self._ledger = ledger

    async def write(self, entry: LedgerEntry) -> None:
        try:
            await self._redis.xadd(self._stream, {"e": encode_entry(entry)})
            return
        except (RedisError, OSError) as exc:
            log.warning("ledger stream unavailable (%s); writing to SQL", type(exc).__name__)
        try:
            await self._ledger.record(entry)
        except (SQLAlchemyError, OSError):
            log.exception("ledger entry %s could not be written anywhere", entry.request_id)
            raise
