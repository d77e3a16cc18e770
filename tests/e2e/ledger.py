"""Reading the stack's ledger from a test (rows arrive through the sink, so poll briefly)."""

from __future__ import annotations

import asyncio

from gateway.accounting.ledger import SqlLedger
from gateway.accounting.records import LedgerEntry


async def wait_entry(database_url: str, request_id: str, timeout_s: float = 10.0) -> LedgerEntry:
    ledger = await SqlLedger.connect(database_url)
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            entry = await ledger.get(request_id)
            if entry is not None:
                return entry
            if loop.time() > deadline:
                raise AssertionError(f"no ledger row for {request_id} after {timeout_s}s")
            await asyncio.sleep(0.05)
    finally:
        await ledger.aclose()
