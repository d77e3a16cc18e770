"""A ledger sink as its own process (for the crash test): ``python -m … <redis> <stream> <db>``."""

from __future__ import annotations

import asyncio
import sys

from gateway.accounting import SqlLedger
from gateway.accounting.dead_letters import DeadLetters
from gateway.accounting.sink import LedgerSink
from gateway.queue.client.connection import redis_client


async def main(redis_url: str, stream: str, db_url: str, consumer: str) -> None:
    ledger = await SqlLedger.connect(db_url)
    redis = redis_client(redis_url, socket_timeout=5.0)
    sink = LedgerSink(
        redis=redis,
        blocking_redis=redis,
        stream=stream,
        group="ledger",
        consumer=consumer,
        ledger=ledger,
        dead_letters=DeadLetters(ledger.engine),
        dead_letter_stream=f"{stream}:dead",
        claim_idle_ms=500,
    )
    sink.start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
