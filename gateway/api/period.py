"""A report's period: ``?from=&to=``, two UTC days, both optional, ``to`` inclusive.

One dependency for every endpoint that reads the ledger over days (the cost and what-if
reports, the rules console's figures), so each names the parameters, documents them and refuses
``to`` before ``from`` the same way::

    async def costs(period: PeriodDep) -> ...:
        report = await cost_report(ledger, start=period.start, end=period.end)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from typing import Annotated

from fastapi import Depends, Query

from gateway.errors import InvalidRequest

__all__ = ["Period", "PeriodDep", "period"]


@dataclass(frozen=True, slots=True)
class Period:
    """UTC days; ``None``: from the first row, or to the last."""

    start: date | None = None
    end: date | None = None


def period(
    start: Annotated[date | None, Query(alias="from", description="first UTC day")] = None,
    end: Annotated[date | None, Query(alias="to", description="last UTC day, inclusive")] = None,
) -> Period:
    """The period asked for; 400 ``invalid_request`` (``to``) when it ends before it starts."""
    if start is not None and end is not None and end < start:
        raise InvalidRequest("'to' is before 'from'", param="to")
    return Period(start, end)


PeriodDep = Annotated[Period, Depends(period)]
