"""The ledger's SQL table, and the idempotent DDL that creates it.

One row per authenticated request, keyed by ``request_id``; ``idempotency_key`` (indexed with the
tenant, where set) is how a repeated request is recognised once Redis has lost its key. Money is
BIGINT micro-dollars, ``NULL`` when the price is unknown (``price_known`` false);
``estimated_micro_usd`` is the part of the cost priced from estimated tokens (``NULL`` when the
backends counted every token; ``LedgerEntry.estimated_micro_usd``). ``provisional`` marks the
edge's 504 for a started job, whose bookkeeping a run's entry may still replace once
(``gateway.accounting.supersede``); ``superseded_at`` says when it was (indexed where set: the
rollups look for days whose rows changed after they were rolled up). Times are stored
in UTC: ``TIMESTAMPTZ`` on PostgreSQL, UTC text on SQLite; both read back as aware UTC datetimes.

Also the daily rollups (``ledger_daily``: tenant x model x tier x tag per UTC day, with the
requests and cost resting on estimated usage) and the GPU
true-up (``gpu_trueup``: what each self-hosted pool cost that day, allocated to tenants by token
share), and the dead letters (``ledger_dead_letters``: ledger events SQL refused, set aside
by the sink so that the rest keep flowing; ``gateway.accounting.dead_letters``). The schema
is created and upgraded by Alembic (``gateway/accounting/migrations``); this metadata is what
the migrations produce (a test compares them). ``create_schema`` is kept for tests that want
the tables without migrations.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Date,
    DateTime,
    Dialect,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    false,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.types import TypeDecorator

from gateway.sqlschema import create_missing_tables

__all__ = [
    "SCHEMA_LOCK_KEY",
    "UTCDateTime",
    "budget_alerts",
    "create_schema",
    "gpu_trueup",
    "ledger_daily",
    "ledger_dead_letters",
    "ledger_entries",
    "metadata",
]

SCHEMA_LOCK_KEY = 0x7469_6572_6761_7465
"""``pg_advisory_xact_lock`` key held while creating the schema (ASCII "tiergate")."""


class UTCDateTime(TypeDecorator[datetime]):
    """Aware datetimes in, aware UTC datetimes out, on every backend. Naive values are refused."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value!r}: the ledger stores aware UTC times")
        utc = value.astimezone(UTC)
        # SQLite keeps no offset: store the UTC wall time so text order is time order.
        return utc.replace(tzinfo=None) if dialect.name == "sqlite" else utc

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


_JSON = JSON().with_variant(JSONB(), "postgresql")

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "pk": "pk_%(table_name)s",
    }
)

ledger_entries = Table(
    "ledger_entries",
    metadata,
    Column("request_id", String, primary_key=True),
    Column("tenant", String, nullable=False),
    Column("principal", String, nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("outcome", String, nullable=False),
    Column("status_code", Integer, nullable=False),
    Column("requested_model", String, nullable=False, default=""),
    Column("tier", String),
    Column("deployment", String),
    Column("rule", String),
    Column("score", Float),
    Column("stream", Boolean, nullable=False, default=False),
    Column("app", String),
    Column("tags", _JSON, nullable=False, comment="JSON array of strings"),
    Column("prompt_tokens", BigInteger, nullable=False, default=0),
    Column("completion_tokens", BigInteger, nullable=False, default=0),
    Column("cost_micro_usd", BigInteger),
    Column("baseline_micro_usd", BigInteger),
    Column("cost_nano_usd", BigInteger, comment="NULL before 0008: cost_micro_usd x 1000"),
    Column("baseline_nano_usd", BigInteger, comment="NULL before 0008: baseline_micro_usd x 1000"),
    Column("price_source", String, comment="where the prices came from; NULL before 0008"),
    Column(
        "endpoint",
        String,
        nullable=False,
        default="chat",
        server_default="chat",
        comment="the API called: chat, completions, responses, embeddings",
    ),
    Column("price_known", Boolean, nullable=False),
    Column("latency_ms", Float, nullable=False, default=0.0),
    Column("ttft_ms", Float),
    Column("queue_ms", Float),
    Column("attempts", _JSON, nullable=False, comment="JSON array of Attempt.to_dict() objects"),
    Column(
        "idempotency_key",
        String,
        comment="the client's idempotency-key, on the row of the request that ran under it",
    ),
    Column(
        "estimated_micro_usd",
        BigInteger,
        comment="part of cost_micro_usd priced from estimated tokens; NULL: none estimated",
    ),
    Column(
        "provisional",
        Boolean,
        nullable=False,
        server_default=false(),
        comment="the edge's 504 for a started job: a run's entry may still replace its bookkeeping",
    ),
    Column(
        "superseded_at",
        UTCDateTime(),
        comment="when a run's entry replaced this provisional row's bookkeeping",
    ),
    Index(None, "tenant", "created_at"),
    Index(None, "created_at"),
    Index(
        None,
        "tenant",
        "idempotency_key",
        sqlite_where=text("idempotency_key IS NOT NULL"),
        postgresql_where=text("idempotency_key IS NOT NULL"),
    ),
    Index(
        None,
        "superseded_at",
        sqlite_where=text("superseded_at IS NOT NULL"),
        postgresql_where=text("superseded_at IS NOT NULL"),
    ),
)

ledger_daily = Table(
    "ledger_daily",
    metadata,
    Column("day", Date, primary_key=True),
    Column("tenant", String, primary_key=True),
    Column("deployment", String, primary_key=True, comment="'' when no deployment answered"),
    Column("tier", String, primary_key=True, comment="'' when the request had no tier"),
    Column("tag", String, primary_key=True, comment="'' for untagged requests"),
    Column("requests", BigInteger, nullable=False),
    Column("prompt_tokens", BigInteger, nullable=False),
    Column("completion_tokens", BigInteger, nullable=False),
    Column("cost_micro_usd", BigInteger, nullable=False),
    Column("baseline_micro_usd", BigInteger, nullable=False),
    Column("savings_micro_usd", BigInteger, nullable=False),
    Column("unknown_price", BigInteger, nullable=False),
    Column("unknown_baseline", BigInteger, nullable=False),
    Column("rolled_up_at", UTCDateTime(), nullable=False),
    Column(
        "estimated",
        BigInteger,
        nullable=False,
        server_default=text("0"),
        comment="requests booked in part from estimated usage",
    ),
    Column(
        "estimated_micro_usd",
        BigInteger,
        nullable=False,
        server_default=text("0"),
        comment="part of cost_micro_usd priced from estimated tokens",
    ),
)

gpu_trueup = Table(
    "gpu_trueup",
    metadata,
    Column("day", Date, primary_key=True),
    Column("deployment", String, primary_key=True),
    Column("tenant", String, primary_key=True, comment="'' holds a day with no tokens (idle)"),
    Column("tokens", BigInteger, nullable=False),
    Column("booked_micro_usd", BigInteger, nullable=False),
    Column("allocated_micro_usd", BigInteger, nullable=False),
    Column("pool_paid_micro_usd", BigInteger, nullable=False),
    Column("paid_hours", Float, nullable=False),
    Column("rolled_up_at", UTCDateTime(), nullable=False),
)

ledger_dead_letters = Table(
    "ledger_dead_letters",
    metadata,
    Column("stream_id", String, primary_key=True, comment="the event's id in the ledger stream"),
    Column("request_id", String, comment="the event's request id, when it could be read"),
    Column("tenant", String, comment="the event's tenant, when it could be read"),
    Column("reason", String, nullable=False, comment="why it was set aside"),
    Column(
        "event",
        Text,
        nullable=False,
        comment="the event as it was in the stream (JSON; characters SQL cannot store escaped)",
    ),
    Column("set_aside_at", UTCDateTime(), nullable=False),
    Index(None, "set_aside_at"),
)


budget_alerts = Table(
    "budget_alerts",
    metadata,
    Column("tenant", String, primary_key=True),
    Column("budget", String, primary_key=True),
    Column("window_start", UTCDateTime(), primary_key=True),
    Column("threshold", Float, primary_key=True, comment="fraction of the limit (alert_at)"),
    Column("spent_micro_usd", BigInteger, nullable=False),
    Column("limit_micro_usd", BigInteger, nullable=False),
    Column("fired_at", UTCDateTime(), nullable=False),
    Column("status", String, nullable=False, comment="sending, sent, failed or no webhook"),
    Column("attempts", Integer, nullable=False),
    Column("error", String, comment="the last attempt's error, when it failed"),
)


async def create_schema(conn: AsyncConnection) -> None:
    """Create every table and index that is missing; safe to run from several processes at once."""
    await create_missing_tables(conn, metadata, SCHEMA_LOCK_KEY)
