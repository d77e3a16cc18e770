"""A worker process that kills itself (SIGKILL) at one point of a job's end, for the crash
tests of ``Finisher.finish``: ``python -m tests.gateway.queue.finish_proc REDIS_URL PREFIX
SIM_URL NAME POINT LEDGER_DB``. ``POINT``: ``booking`` (the run has its answer; nothing is
booked, acknowledged or sent) or ``booked`` (its booking pipeline went out and came back).
Books through the real ledger writer and coalescer. Prints ``ready`` once it takes work."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable

import redis.asyncio as aioredis

from gateway.accounting.ledger import SqlLedger
from gateway.accounting.records import LedgerEntry
from gateway.accounting.writer import LedgerWriter
from gateway.coalescer import Coalescer
from gateway.queue.keys import RedisKeys
from tests.gateway.queue.conftest import CountingSim, start_node


class DyingWriter(LedgerWriter):
    point = "booking"

    async def write(
        self,
        entry: LedgerEntry,
        *,
        then: Callable[[], None] | None = None,
        sql_fallback: bool = True,
    ) -> None:
        if self.point == "booking":
            os.kill(os.getpid(), signal.SIGKILL)
        await super().write(entry, then=then, sql_fallback=sql_fallback)
        os.kill(os.getpid(), signal.SIGKILL)


async def main(redis_url: str, prefix: str, sim_url: str, name: str, point: str, db: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    keys = RedisKeys(prefix)
    coalescer = Coalescer(redis)
    ledger = await SqlLedger.connect(f"sqlite+aiosqlite:///{db}")
    writer = DyingWriter(redis, keys.ledger_events, ledger, coalescer=coalescer)
    writer.point = point
    sim = CountingSim(url=sim_url, capacity=2)
    await start_node(
        redis, keys, [sim], writer, name, lease_ms=2000, reclaim_idle_s=1.5, heartbeat_s=0.3,
        coalescer=coalescer,
    )  # fmt: skip
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:7]))
