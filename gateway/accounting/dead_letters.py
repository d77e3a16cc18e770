"""Dead letters: ledger events the ledger cannot book, set aside so the others keep flowing.

The sink books events in batches. An event SQL refuses for what it holds — a NUL byte, which
PostgreSQL cannot store in text, a number out of range — would make every retry of its batch
fail, and so stop booking for every tenant. ``is_poison`` tells such a refusal (SQLSTATE class
22 "data exception" or 23 "integrity constraint violation", or a value the driver cannot bind)
from the database being away (anything else: the sink pauses and retries, and the events wait in
Redis). The sink then books the batch's events one by one and sets aside only those refused on
their own, with the events it could not decode at all.

A dead letter is kept twice: in SQL (``ledger_dead_letters``, the record finance and
``tiergate ledger verify`` read; insert-if-absent by stream id, so a sink that dies half-way
repeats nothing) and in a Redis stream (``RedisKeys.ledger_dead_letters``, what ``/readyz`` and
an operator's ``XRANGE`` see at once), and counted in ``tiergate_ledger_dead_letters_total``.
The event's text is stored as it was, with the characters SQL cannot store escaped, so what was
refused can be read, corrected and replayed by hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import orjson
from sqlalchemy import Insert, func, insert, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, SQLAlchemyError, StatementError
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.accounting.schema import ledger_dead_letters
from gateway.codec import NATIVE, RecordCodec

__all__ = ["WRITE_ERRORS", "DeadLetter", "DeadLetters", "is_poison", "storable"]

_REASON_CHARS = 500
"""A reason is cut to this many characters (a driver's message can quote the whole statement)."""


WRITE_ERRORS = (SQLAlchemyError, OverflowError)
"""What writing an event can raise: SQLAlchemy's errors, and the ``OverflowError`` SQLite's
driver raises for an integer too large for it."""


def is_poison(exc: Exception) -> bool:
    """Whether SQL refused a write for what it holds (retrying cannot help), rather than being
    unreachable or broken (retrying can)."""
    if isinstance(exc, DataError | IntegrityError | OverflowError):
        return True
    if isinstance(exc, DBAPIError):
        state = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
        return isinstance(state, str) and state[:2] in ("22", "23")
    # A StatementError that is not a DBAPIError was raised while binding a value (an int too
    # large for the column type, a value of the wrong type): the statement never reached SQL.
    return isinstance(exc, StatementError)


def storable(text: str) -> str:
    """``text`` with what SQL text columns cannot hold escaped: NUL and lone surrogates."""
    if "\x00" in text:
        text = text.replace("\x00", "\\u0000")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One ledger event set aside."""

    stream_id: str
    reason: str
    event: str
    """The event's text as it was in the stream, made storable (``storable``)."""
    set_aside_at: datetime
    request_id: str | None = None
    tenant: str | None = None

    @classmethod
    def of(cls, stream_id: str, raw: bytes | None, reason: str, at: datetime) -> DeadLetter:
        """The dead letter of the raw event ``raw`` (its request id and tenant if readable)."""
        text = "" if raw is None else raw.decode("utf-8", "backslashreplace")
        request_id = tenant = None
        try:
            data = orjson.loads(raw or b"")
        except orjson.JSONDecodeError:
            data = None
        if isinstance(data, dict):
            request_id = _text_or_none(data.get("request_id"))
            tenant = _text_or_none(data.get("tenant"))
        return cls(
            stream_id=stream_id,
            reason=storable(reason)[:_REASON_CHARS],
            event=storable(text),
            set_aside_at=at,
            request_id=request_id,
            tenant=tenant,
        )

    def stream_fields(self) -> dict[str, str]:
        """The fields of its entry in the dead-letter stream."""
        return {"id": self.stream_id, "reason": self.reason, "e": self.event}


_ROW = RecordCodec(DeadLetter, {datetime: NATIVE})
"""A dead letter to and from its ``ledger_dead_letters`` row (columns named as the fields)."""


def _text_or_none(value: object) -> str | None:
    return storable(value)[:256] if isinstance(value, str) else None


class DeadLetters:
    """The ``ledger_dead_letters`` table."""

    __slots__ = ("_engine", "_insert")

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        dialect = engine.dialect.name
        self._insert: Insert
        if dialect == "postgresql":
            self._insert = pg_insert(ledger_dead_letters).on_conflict_do_nothing()
        elif dialect == "sqlite":
            self._insert = sqlite_insert(ledger_dead_letters).on_conflict_do_nothing()
        else:  # pragma: no cover - the ledger supports PostgreSQL and SQLite
            self._insert = insert(ledger_dead_letters)

    async def record(self, letters: Sequence[DeadLetter]) -> None:
        """Store ``letters``; one already stored (same stream id) is left as it is."""
        if not letters:
            return
        rows = [_ROW.to_values(d) for d in letters]
        async with self._engine.begin() as conn:
            await conn.execute(self._insert, rows)

    async def count(self) -> int:
        async with self._engine.connect() as conn:
            query = select(func.count()).select_from(ledger_dead_letters)
            return int((await conn.execute(query)).scalar_one())

    async def latest(self, limit: int = 20) -> list[DeadLetter]:
        """The newest ``limit`` dead letters, newest first."""
        t = ledger_dead_letters.c
        query = select(ledger_dead_letters).order_by(t.set_aside_at.desc()).limit(limit)
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [_ROW.from_values(r) for r in rows]
