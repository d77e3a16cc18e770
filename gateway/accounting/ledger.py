"""``SqlLedger``: the ``Ledger`` on SQLAlchemy's async engine (SQLite by default, PostgreSQL in
production).

``record`` is one ``INSERT … ON CONFLICT (request_id) DO UPDATE … WHERE`` the booked row is
provisional and the new entry is not: the first entry for an id wins, a repeat (a retried job, a
second worker, an event delivered twice) returns ``False`` and changes nothing — except that a
run's entry replaces the bookkeeping of the edge's provisional row, once
(``gateway.accounting.supersede``). One statement, so it is atomic on both dialects and across
processes (PostgreSQL locks the conflicting row; SQLite has one writer). ``record_many`` books a
batch in one transaction (for the ledger sink), folded first to one entry per id.
SQLite runs in WAL mode with a busy timeout so the gateway and a separate worker process can
write the same file at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, bindparam, case, false, func, or_, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, RowMapping
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql.dml import Insert

from gateway.accounting.migrate import sqlite_migration_lock, upgrade
from gateway.accounting.records import Attempt, LedgerEntry
from gateway.accounting.schema import ledger_entries
from gateway.accounting.supersede import BOOKED_FIELDS, CLIENT_FIELDS, fold
from gateway.codec import NATIVE, RecordCodec
from gateway.sqlengine import create_sql_engine

__all__ = ["SqlLedger"]


def _upsert(dialect: str) -> Insert:
    """Insert; on a conflict replace the bookkeeping of a provisional row with a run's entry
    (``supersede.BOOKED_FIELDS``), else change nothing. ``superseded_at`` is the bound
    ``:superseded_now`` unless the entry was folded with its provisional row already."""
    if dialect == "postgresql":
        insert: Any = postgresql.insert(ledger_entries)
    elif dialect == "sqlite":
        insert = sqlite.insert(ledger_entries)
    else:
        raise ValueError(f"unsupported ledger dialect {dialect!r}")
    t, new = ledger_entries.c, insert.excluded
    now = bindparam("superseded_now", type_=t.superseded_at.type)
    run_after = and_(t.provisional.is_(True), new.provisional.is_(False))
    answer_after = and_(
        t.provisional.is_(False), t.superseded_at.is_(None), new.provisional.is_(True)
    )
    replaced: dict[str, Any] = {
        name: case((run_after, new[name]), else_=t[name]) for name in BOOKED_FIELDS
    }
    replaced.update(
        {name: case((answer_after, new[name]), else_=t[name]) for name in CLIENT_FIELDS}
    )
    replaced["provisional"] = false()
    replaced["superseded_at"] = func.coalesce(new.superseded_at, now)
    upsert: Insert = insert.on_conflict_do_update(
        index_elements=[t.request_id], set_=replaced, where=or_(run_after, answer_after)
    )
    return upsert


_ROW = RecordCodec(LedgerEntry, {datetime: NATIVE, Attempt: (Attempt.to_dict, Attempt.from_dict)})
"""Column values: one column per field (``tags`` and ``attempts`` JSON), times as the driver's."""


def entry_to_row(entry: LedgerEntry) -> dict[str, Any]:
    """A ``LedgerEntry`` as column values. A ``None`` cost is always stored as unknown
    (``price_known`` false), whatever the entry says; a naive ``created_at`` is refused."""
    if entry.created_at.tzinfo is None or entry.created_at.utcoffset() is None:
        raise ValueError(f"{entry.request_id}: created_at must be timezone-aware")
    values = _ROW.to_values(entry)
    values["price_known"] = entry.price_known and entry.cost_micro_usd is not None
    return values


def row_to_entry(row: RowMapping) -> LedgerEntry:
    return _ROW.from_values(row)


class SqlLedger:
    """The SQL ledger. Build with ``await SqlLedger.connect(url)`` (creates the schema), or hand
    in an engine and call ``migrate()``; close with ``aclose()``."""

    __slots__ = ("_engine", "_insert", "_returning_ids")

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._insert = _upsert(engine.dialect.name)
        self._returning_ids = self._insert.returning(ledger_entries.c.request_id)

    @classmethod
    async def connect(
        cls, url: str | URL, *, migrate: bool = True, **engine_kwargs: Any
    ) -> SqlLedger:
        ledger = cls(create_sql_engine(url, **engine_kwargs))
        if migrate:
            try:
                await ledger.migrate()
            except BaseException:
                await ledger.aclose()
                raise
        return ledger

    @property
    def engine(self) -> AsyncEngine:
        return self._engine

    @property
    def dialect(self) -> str:
        return self._engine.dialect.name

    async def migrate(self) -> None:
        """Upgrade the schema to the newest Alembic revision (idempotent, safe from several
        processes; a pre-Alembic database is stamped first)."""
        database = self._engine.url.database if self.dialect == "sqlite" else None
        async with sqlite_migration_lock(database), self._engine.begin() as conn:
            await upgrade(conn)

    async def record(self, entry: LedgerEntry) -> bool:
        """Write ``entry``; ``False`` (and no change) when its ``request_id`` is already booked,
        unless it replaces a provisional row's bookkeeping (``True``)."""
        values = {**entry_to_row(entry), "superseded_now": datetime.now(UTC)}
        async with self._engine.begin() as conn:
            result = await conn.execute(self._insert, values)
        return result.rowcount == 1

    async def record_many(self, entries: Sequence[LedgerEntry]) -> frozenset[str]:
        """Write a batch in one transaction; returns the ids newly booked or whose provisional
        row was replaced. Ids already booked keep their row, and ids repeated within the batch
        their first entry (``supersede.fold``: a provisional one gives way to a run's).
        (SQLAlchemy's "insertmanyvalues" turns the batch into multi-row ``INSERT … RETURNING``
        statements, which may not touch one row twice: hence the fold.)"""
        if not entries:
            return frozenset()
        now = datetime.now(UTC)
        rows = [{**entry_to_row(e), "superseded_now": now} for e in fold(entries, now)]
        async with self._engine.begin() as conn:
            result = await conn.execute(self._returning_ids, rows)
            return frozenset(result.scalars())

    async def get(self, request_id: str, *, tenant: str | None = None) -> LedgerEntry | None:
        """The entry for ``request_id``; with ``tenant``, only if it is that tenant's."""
        query = select(ledger_entries).where(ledger_entries.c.request_id == request_id)
        if tenant is not None:
            query = query.where(ledger_entries.c.tenant == tenant)
        async with self._engine.connect() as conn:
            row = (await conn.execute(query)).mappings().first()
        return None if row is None else row_to_entry(row)

    async def spent(
        self,
        tenant: str,
        start: datetime,
        end: datetime,
        *,
        app: str | None = None,
        tag: str | None = None,
    ) -> int:
        """Micro-dollars booked for ``tenant`` (one app, one tag) with ``start <= created_at <
        end``; rows of unknown price count 0. What a budget window holds, rebuilt from SQL."""
        t = ledger_entries.c
        where = [t.tenant == tenant, t.created_at >= start, t.created_at < end]
        if app is not None:
            where.append(t.app == app)
        async with self._engine.connect() as conn:
            if tag is None:
                query = select(func.coalesce(func.sum(t.cost_micro_usd), 0)).where(*where)
                return int((await conn.execute(query)).scalar_one())
            rows = await conn.execute(select(t.cost_micro_usd, t.tags).where(*where))
            return sum(int(cost or 0) for cost, tags in rows if tag in (tags or ()))

    async def rate_usage(
        self, tenant: str, start: datetime, end: datetime
    ) -> list[tuple[datetime, int]]:
        """``(created_at, prompt + completion tokens)`` of ``tenant``'s rows with ``start <=
        created_at <= end``, oldest first, leaving out requests the rate limits never charged:
        those refused before routing (no tier) and those the limits refused. What a rate-limit
        bucket is rebuilt from after a Redis loss."""
        t = ledger_entries.c
        query = (
            select(t.created_at, t.prompt_tokens + t.completion_tokens)
            .where(
                t.tenant == tenant,
                t.created_at >= start,
                t.created_at <= end,
                t.tier.is_not(None),
                t.outcome != "rate_limit_exceeded",
            )
            .order_by(t.created_at)
        )
        async with self._engine.connect() as conn:
            rows = await conn.execute(query)
            return [(at, int(tokens or 0)) for at, tokens in rows]

    async def idempotent_request(self, tenant: str, key: str, since: datetime) -> str | None:
        """The request id of ``tenant``'s earliest row since ``since`` that ran under
        idempotency key ``key``; ``None`` when there is none (another tenant's rows never
        count)."""
        t = ledger_entries.c
        query = (
            select(t.request_id)
            .where(t.tenant == tenant, t.idempotency_key == key, t.created_at >= since)
            .order_by(t.created_at)
            .limit(1)
        )
        async with self._engine.connect() as conn:
            found = (await conn.execute(query)).scalar_one_or_none()
        return None if found is None else str(found)

    async def ping(self) -> None:
        async with self._engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    async def aclose(self) -> None:
        await self._engine.dispose()
