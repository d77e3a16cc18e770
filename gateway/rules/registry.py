"""Every process's copy of the running rules, kept in step with SQL.

SQL holds the versions (``SqlRuleStore``); each gateway process compiles the newest version of
each tenant once and keeps it in memory, so a request never waits on I/O for its rules. A change
reaches every process two ways: a Redis pub/sub message (the usual path, one round trip) and a
version check against SQL every ``poll_interval_s`` (so a missed message, or a Redis outage,
cannot leave a process stale for longer than that).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from types import MappingProxyType

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

from gateway.rules.store import GLOBAL, RuleVersion, SqlRuleStore
from gateway.tasks import stop_task
from router.catalog import Catalog
from router.rules import RuleSet, RulesInvalid, parse_rules

__all__ = ["RuleRegistry"]

log = logging.getLogger(__name__)
_EMPTY = RuleSet()


class RuleRegistry:
    """Compiled rules per tenant (tenant rules, then the global ones) and their versions."""

    def __init__(
        self,
        store: SqlRuleStore,
        redis: aioredis.Redis,
        *,
        channel: str,
        catalog: Catalog,
        poll_interval_s: float = 0.5,
    ) -> None:
        self.store = store
        self.catalog = catalog
        self._redis = redis
        self._channel = channel
        self._poll_s = poll_interval_s
        self._sets: Mapping[str, RuleSet] = MappingProxyType({})
        self._versions: Mapping[str, int] = MappingProxyType({})
        self._combined: dict[str, RuleSet] = {}
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        """Set by ``aclose``: the loops also stop on it, should a library swallow the
        cancellation (redis-py can, mid-command)."""

    # ---- reading (request path: memory only) ----

    def for_tenant(self, tenant: str) -> RuleSet:
        """The tenant's rules followed by the global ones."""
        combined = self._combined.get(tenant)
        if combined is None:
            own = self._sets.get(tenant, _EMPTY)
            combined = own.then(self._sets.get(GLOBAL, _EMPTY))
            self._combined[tenant] = combined
        return combined

    def own(self, tenant: str) -> RuleSet:
        """The tenant's own rules, without the global ones (``GLOBAL``: the global rules)."""
        return self._sets.get(tenant, _EMPTY)

    def with_draft(self, tenant: str, draft: RuleSet) -> RuleSet:
        """What would run for ``tenant`` if ``draft`` replaced its own rules: the draft, then
        the global rules (a draft of ``GLOBAL`` itself stands alone, marked global)."""
        if tenant == GLOBAL:
            return draft.scoped("global")
        return draft.then(self._sets.get(GLOBAL, _EMPTY))

    def version(self, tenant: str) -> int:
        return self._versions.get(tenant, 0)

    @property
    def versions(self) -> Mapping[str, int]:
        return self._versions

    # ---- writing ----

    async def validate(self, source: str) -> RuleSet:
        """Compile ``source`` against the catalog; raises ``RulesInvalid`` (with the line).

        In a thread: the source is a client's, and parsing it (bounded by the rule file's
        limits, ``router.rules.source``) is CPU work that must not hold up the event loop."""
        return await asyncio.to_thread(parse_rules, source, catalog=self.catalog)

    async def apply(
        self,
        tenant: str,
        source: str | None,
        *,
        author: str,
        action: str = "put",
        restored: int | None = None,
    ) -> RuleVersion:
        """Validate, store a new version, tell every process, and use it here at once.

        Invalid rules raise ``RulesInvalid`` before anything is stored, so the running rules
        stay in force.
        """
        if source is not None:
            await self.validate(source)
        version = await self.store.append(
            tenant, source, author=author, action=action, restored=restored
        )
        with contextlib.suppress(RedisError, OSError):
            await self._redis.publish(self._channel, f"{tenant}:{version.version}")
        await self.refresh()
        return version

    async def rollback(self, tenant: str, to: int, *, author: str) -> RuleVersion | None:
        """A new version whose source is exactly version ``to``'s; ``None`` if it is unknown."""
        old = await self.store.get(tenant, to)
        if old is None:
            return None
        return await self.apply(tenant, old.source, author=author, action="rollback", restored=to)

    # ---- keeping in step ----

    async def refresh(self) -> bool:
        """Load the tenants whose version in SQL differs from ours; ``True`` if any did."""
        async with self._lock:
            heads = await self.store.heads()
            changed = [t for t, v in heads.items() if self._versions.get(t) != v]
            if not changed:
                return False
            sets = dict(self._sets)
            versions = dict(self._versions)
            for tenant in changed:
                current = await self.store.current(tenant)
                if current is None:
                    continue
                try:
                    compiled = _EMPTY if current.source is None else _compile(current.source)
                    sets[tenant] = compiled.scoped("global") if tenant == GLOBAL else compiled
                except RulesInvalid as exc:  # stored while valid; keep what runs
                    log.error("rules of %s v%d do not compile: %s", tenant, current.version, exc)
                versions[tenant] = current.version
            self._sets = MappingProxyType(sets)
            self._versions = MappingProxyType(versions)
            self._combined = {}
            return True

    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.create_task(self._run(), name="rules-reload")

    async def aclose(self) -> None:
        self._closing = True
        if self._task is not None:
            await stop_task(self._task)
            self._task = None

    async def _run(self) -> None:
        while not self._closing:
            try:
                await self._listen()
            except (RedisError, OSError) as exc:
                log.warning("rule change channel lost (%s); polling SQL", exc)
                await self._poll_once()
                await asyncio.sleep(self._poll_s)

    async def _listen(self) -> None:
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(self._channel)
            await self._poll_once()  # changes made while we were not subscribed
            while not self._closing:
                message = await pubsub.get_message(timeout=self._poll_s)
                if message is not None:
                    log.debug("rule change announced: %r", message.get("data"))
                await self._poll_once()
        finally:
            with contextlib.suppress(RedisError, OSError):
                await pubsub.aclose()  # type: ignore[no-untyped-call]

    async def _poll_once(self) -> None:
        try:
            await self.refresh()
        except (SQLAlchemyError, OSError) as exc:
            log.warning("rule version check failed: %s", exc)


def _compile(source: str) -> RuleSet:
    # Stored rules were valid against the catalog when applied; compile them without it so a
    # later catalog change cannot stop them from loading (an unknown deployment is skipped).
    return parse_rules(source)
