"""Redis clients as tiergate uses them: fail fast, never retry behind the caller's back."""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

__all__ = ["redis_client"]


def redis_client(url: str, *, socket_timeout: float | None = 1.0) -> aioredis.Redis:
    """A lost Redis must become a 503 within a second, not a hidden retry loop; callers that
    block (``XREAD BLOCK``) pass a ``socket_timeout`` longer than their block time."""
    return aioredis.Redis.from_url(
        url,
        socket_connect_timeout=0.5,
        socket_timeout=socket_timeout,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=0,
    )
