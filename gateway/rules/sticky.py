"""Conversation stickiness: once a conversation went to the large tier, later turns stay there.

A conversation is named by the client (``x-tiergate-conversation-id``) or, without one, by a hash
of its opening messages (the system prompt and the first user message, which every later turn
repeats). The state is one small Redis key per conversation with a TTL, read into the planner's
input before the (pure) decision and written after it.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.queue.keys import RedisKeys
from router.catalog import Tier
from router.features import message_text

__all__ = ["StickyConversations", "conversation_key"]

log = logging.getLogger(__name__)


def conversation_key(
    conversation_id: str | None, messages: Sequence[Mapping[str, Any]]
) -> str | None:
    """A stable key for the conversation; ``None`` for a first turn without a client id (there
    is nothing earlier to stick to, and the hash is only needed once it has a second turn)."""
    if conversation_id:
        return "id-" + hashlib.sha256(conversation_id.encode()).hexdigest()[:32]
    opening: list[tuple[str, str]] = []
    users = 0
    for message in messages:
        role = str(message.get("role", ""))
        if role == "user":
            users += 1
            if users == 1:
                opening.append((role, message_text(message)))
        elif users == 0 and role in ("system", "developer"):
            opening.append((role, message_text(message)))
    if not opening:
        return None
    digest = hashlib.sha256(orjson.dumps(opening)).hexdigest()[:32]
    return "h-" + digest


def later_turn(conversation_id: str | None, n_turns: int) -> bool:
    return conversation_id is not None or n_turns > 1


class StickyConversations:
    def __init__(self, redis: aioredis.Redis, prefix: str, ttl_s: int) -> None:
        self._redis = redis
        self._keys = RedisKeys(prefix)
        self._ttl_s = ttl_s

    def _key(self, tenant: str, conversation: str) -> str:
        return self._keys.sticky_tier(tenant, conversation)

    async def tier(self, tenant: str, conversation: str) -> Tier | None:
        """The tier the conversation is held to; ``None`` when none, or Redis cannot say (then
        routing goes on without stickiness rather than failing)."""
        try:
            value = await self._redis.get(self._key(tenant, conversation))
        except (RedisError, OSError) as exc:
            log.warning("sticky conversation read failed: %s", exc)
            return None
        if value is None:
            return None
        try:
            return Tier(value.decode() if isinstance(value, bytes) else str(value))
        except ValueError:
            return None

    async def hold(self, tenant: str, conversation: str, tier: Tier) -> None:
        """Hold the conversation to ``tier`` (refreshing the TTL)."""
        try:
            await self._redis.set(self._key(tenant, conversation), tier.value, ex=self._ttl_s)
        except (RedisError, OSError) as exc:
            log.warning("sticky conversation write failed: %s", exc)
