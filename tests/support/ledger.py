"""Reading a running stack's ledger from a test (rows arrive through the sink, so poll)."""

from __future__ import annotations

from collections.abc import Callable

from gateway.accounting.ledger import SqlLedger
from gateway.accounting.records import LedgerEntry
from tests.support.polling import value_when

__all__ = ["wait_entry"]


def _booked(entry: LedgerEntry) -> bool:
    return True


async def wait_entry(
    database_url: str,
    request_id: str,
    timeout_s: float = 10.0,
    *,
    where: Callable[[LedgerEntry], bool] = _booked,
    what: str = "booked",
) -> LedgerEntry:
    """The request's ledger row once there is one that ``where`` accepts (e.g. ``lambda e:
    e.superseded_at is not None``: replaced); ``what`` names that in the failure."""
    ledger = await SqlLedger.connect(database_url)
    try:
        entry = await value_when(
            lambda: ledger.get(request_id),
            lambda found: found is not None and where(found),
            timeout_s,
            what=f"no ledger row for {request_id} {what}",
        )
    finally:
        await ledger.aclose()
    assert entry is not None
    return entry
