"""Building the rules part of the services (called from ``open_services``)."""

from __future__ import annotations

import contextlib

import redis.asyncio as aioredis

from gateway.queue.keys import RedisKeys
from gateway.rules.edge import RulesRuntime
from gateway.rules.registry import RuleRegistry
from gateway.rules.sticky import StickyConversations
from gateway.rules.store import SqlRuleStore
from gateway.settings import Settings
from router.catalog import Catalog

__all__ = ["changes_channel", "open_rules"]


def changes_channel(prefix: str) -> str:
    return RedisKeys(prefix).rules_channel


async def open_rules(
    settings: Settings,
    redis: aioredis.Redis,
    catalog: Catalog,
    stack: contextlib.AsyncExitStack,
) -> RulesRuntime:
    """The SQL store (same database as the ledger), the hot-reloading registry, and the
    sticky-conversation state; all closed by ``stack``."""
    store = await SqlRuleStore.connect(settings.database.url)
    stack.push_async_callback(store.aclose)
    registry = RuleRegistry(
        store,
        redis,
        channel=changes_channel(settings.redis.key_prefix),
        catalog=catalog,
        poll_interval_s=settings.rules.poll_interval_s,
    )
    await registry.start()
    stack.push_async_callback(registry.aclose)
    sticky = StickyConversations(redis, settings.redis.key_prefix, settings.rules.sticky_ttl_s)
    return RulesRuntime(registry=registry, sticky=sticky)
