"""``SqlRuleStore``: every version of every tenant's rules, in SQL (the ledger's database).

A change never overwrites: ``put``, ``delete`` and ``rollback`` each append a version with its
author (the principal's name), time and a unified diff from the version before. The newest
version of a tenant is what runs; a deleted one (``source`` ``None``) means no rules.
"""

from __future__ import annotations

import difflib
import random
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt

from gateway.codec import NATIVE, RecordCodec
from gateway.rules.schema import create_rules_schema, rule_versions
from gateway.sqlengine import create_sql_engine

__all__ = ["GLOBAL", "RuleVersion", "SqlRuleStore"]

GLOBAL = "_global"
"""The pseudo-tenant whose rules apply to every tenant after its own."""
_ATTEMPTS = 20


def _jitter(retry_state: RetryCallState) -> float:
    """Another writer took the number: back off a little, jittered, longer each time."""
    return random.uniform(0, 0.005 * retry_state.attempt_number)


@dataclass(frozen=True, slots=True)
class RuleVersion:
    tenant: str
    version: int
    author: str
    created_at: datetime
    action: str
    source: str | None
    diff: str
    restored: int | None = None

    def summary(self) -> dict[str, object]:
        return {
            "tenant": self.tenant,
            "version": self.version,
            "author": self.author,
            "created_at": self.created_at.isoformat(),
            "action": self.action,
            "restored": self.restored,
            "diff": self.diff,
        }


_ROW = RecordCodec(RuleVersion, {datetime: NATIVE})
"""A version to and from its ``rule_versions`` row (the column names are the field names)."""


def unified_diff(before: str | None, after: str | None, version: int) -> str:
    lines = difflib.unified_diff(
        (before or "").splitlines(keepends=True),
        (after or "").splitlines(keepends=True),
        fromfile=f"v{version - 1}",
        tofile=f"v{version}",
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


class SqlRuleStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    @classmethod
    async def connect(cls, url: str) -> SqlRuleStore:
        """Open the database and create the rule tables if missing."""
        engine = create_sql_engine(url)
        await create_rules_schema(engine)
        return cls(engine)

    async def aclose(self) -> None:
        await self._engine.dispose()

    async def heads(self) -> dict[str, int]:
        """Every tenant's newest version number (the hot-reload version check)."""
        query = select(rule_versions.c.tenant, func.max(rule_versions.c.version)).group_by(
            rule_versions.c.tenant
        )
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return {str(tenant): int(version) for tenant, version in rows}

    async def current(self, tenant: str) -> RuleVersion | None:
        async with self._engine.connect() as conn:
            return await self._latest(conn, tenant)

    async def get(self, tenant: str, version: int) -> RuleVersion | None:
        query = select(rule_versions).where(
            rule_versions.c.tenant == tenant, rule_versions.c.version == version
        )
        async with self._engine.connect() as conn:
            row = (await conn.execute(query)).mappings().first()
        return None if row is None else _ROW.from_values(row)

    async def history(self, tenant: str) -> list[RuleVersion]:
        query = (
            select(rule_versions)
            .where(rule_versions.c.tenant == tenant)
            .order_by(rule_versions.c.version)
        )
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [_ROW.from_values(row) for row in rows]

    async def append(
        self,
        tenant: str,
        source: str | None,
        *,
        author: str,
        action: str,
        restored: int | None = None,
    ) -> RuleVersion:
        """Add the next version; concurrent writers each get their own number."""
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(IntegrityError),
            stop=stop_after_attempt(_ATTEMPTS),
            wait=_jitter,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                async with self._engine.begin() as conn:
                    latest = await self._latest(conn, tenant)
                    number = 1 if latest is None else latest.version + 1
                    before = None if latest is None else latest.source
                    version = RuleVersion(
                        tenant=tenant,
                        version=number,
                        author=author,
                        created_at=datetime.now(UTC),
                        action=action,
                        source=source,
                        diff=unified_diff(before, source, number),
                        restored=restored,
                    )
                    await conn.execute(insert(rule_versions).values(**_ROW.to_values(version)))
                return version
        raise AssertionError("unreachable")  # reraise=True: the last IntegrityError propagates

    @staticmethod
    async def _latest(conn: AsyncConnection, tenant: str) -> RuleVersion | None:
        query = (
            select(rule_versions)
            .where(rule_versions.c.tenant == tenant)
            .order_by(rule_versions.c.version.desc())
            .limit(1)
        )
        row = (await conn.execute(query)).mappings().first()
        return None if row is None else _ROW.from_values(row)
