"""Redis clients as tiergate uses them: fail fast, never retry behind the caller's back."""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

__all__ = ["DEFAULT_MAX_CONNECTIONS", "redis_client"]

DEFAULT_MAX_CONNECTIONS = 512
"""Connections one client may open; beyond it a command waits for a free one."""


def redis_client(
    url: str,
    *,
    socket_timeout: float | None = 1.0,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
) -> aioredis.Redis:
    """A lost Redis must become a 503 within a second, not a hidden retry loop; callers that
    block (``XREAD BLOCK``) pass a ``socket_timeout`` longer than their block time.

    The pool blocks: when every connection is in use (a burst of concurrent streams), a command
    waits up to ``socket_timeout`` for one instead of failing at once, as redis-py's default pool
    does past its 100 connections."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=socket_timeout if socket_timeout is not None else 5.0,
        socket_connect_timeout=0.5,
        socket_timeout=socket_timeout,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=0,
    )
    return aioredis.Redis.from_pool(pool)  # the client owns the pool: closed with it
