"""Redis clients as tiergate uses them: fail fast, never retry behind the caller's back.

Three topologies (``redis.mode``): one server (``standalone``), a Redis Cluster (``cluster``:
redis-py's ``RedisCluster``, which routes each command by its keys' slot and follows the slots
after a failover), or a master found through Sentinel (``sentinel``). Every key carries a hash
tag (``gateway.queue.keys``), so a script or multi-key command never spans slots. The cluster
client has the same command methods as ``Redis``; callers see it as one (``redis_client``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any, Literal, TypedDict, cast

import redis.asyncio as aioredis
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
    parse_url,
)
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.queue.client.cluster import ScriptingCluster
from gateway.settings import RedisSettings

__all__ = [
    "BLOCKING_READ_S",
    "DEFAULT_MAX_CONNECTIONS",
    "RedisMode",
    "blocking_client",
    "configured_client",
    "redis_client",
]

RedisMode = Literal["standalone", "cluster", "sentinel"]

DEFAULT_MAX_CONNECTIONS = 512
"""Connections one client may open; beyond it a command waits for a free one."""

BLOCKING_READ_S = 1.0
"""The longest a blocking read waits for data: the edge's reply reader and the ledger sink
(``XREAD``/``XREADGROUP BLOCK``), a waiting worker (``BLPOP``), the cancel listener (a pub/sub
poll). Their client (``blocking_client``) times a read out a command's bound after it."""


class _TimedSend(AbstractConnection):
    """Sends under ``asyncio.timeout`` instead of redis-py's ``asyncio.wait_for``, which on
    Python 3.11 wraps every send in a new task: a task and an extra turn of the event loop on
    every command's path (about a tenth of a command's CPU here). Same errors, same clean-up."""

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        if not self.is_connected:
            await self.connect_check_health(check_health=False)
        if check_health:
            await self.check_health()  # type: ignore[no-untyped-call]
        if isinstance(command, str):
            command = command.encode()
        if isinstance(command, bytes):
            command = [command]
        try:
            async with asyncio.timeout(self.socket_timeout or None):
                self._writer.writelines(command)  # type: ignore[union-attr]
                await self._writer.drain()  # type: ignore[union-attr]
        except TimeoutError:
            await self.disconnect(nowait=True)
            raise RedisTimeoutError("Timeout writing to socket") from None
        except OSError as e:
            await self.disconnect(nowait=True)
            raise RedisConnectionError(f"Error while writing to socket: {e}") from e
        except RuntimeError as e:
            # uvloop's answer to a write on a transport closed under us (the node died between
            # the connect and this send): a lost connection like any other.
            await self.disconnect(nowait=True)
            raise RedisConnectionError(f"Error while writing to socket: {e}") from e
        except BaseException:
            # A send cut short (cancelled): the connection holds half a command; drop it.
            await self.disconnect(nowait=True)
            raise


class _TcpConnection(_TimedSend, Connection):
    pass


class _TlsConnection(_TimedSend, SSLConnection):
    pass


class _UnixConnection(_TimedSend, UnixDomainSocketConnection):
    pass


_TIMED: dict[type[AbstractConnection], type[AbstractConnection]] = {
    Connection: _TcpConnection,
    SSLConnection: _TlsConnection,
    UnixDomainSocketConnection: _UnixConnection,
}


class _FailFast(TypedDict):
    """The connection options of every client here, whatever the topology."""

    max_connections: int
    socket_timeout: float | None
    socket_connect_timeout: float
    retry: Retry
    health_check_interval: int


def _failing_fast(
    socket_timeout: float | None, connect_timeout: float, max_connections: int, *, retries: int = 0
) -> _FailFast:
    """Waits bounded by the timeouts, no retry beyond ``retries`` (a command that fails is the
    caller's to retry or not), no health-check round trip before a command."""
    return _FailFast(
        max_connections=max_connections,
        socket_timeout=socket_timeout,
        socket_connect_timeout=connect_timeout,
        retry=Retry(NoBackoff(), retries),
        health_check_interval=0,
    )


def redis_client(
    url: str,
    *,
    socket_timeout: float | None = 1.0,
    connect_timeout: float = 0.5,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    mode: RedisMode = "standalone",
    sentinels: Sequence[str] = (),
    sentinel_master: str = "mymaster",
) -> aioredis.Redis:
    """A lost Redis must become a 503 within a second, not a hidden retry loop; callers that
    block (``XREAD BLOCK``) pass a ``socket_timeout`` longer than their block time.

    The pool blocks: when every connection is in use (a burst of concurrent streams), a command
    waits up to ``socket_timeout`` for one instead of failing at once, as redis-py's default pool
    does past its 100 connections. ``mode``, ``sentinels``, ``sentinel_master``: as in
    ``RedisSettings``."""
    if mode == "cluster":
        return _cluster_client(url, socket_timeout, connect_timeout, max_connections)
    if mode == "sentinel":
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            [_host_port(s) for s in sentinels],
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
        )
        options: dict[str, Any] = dict(parse_url(url))
        for key in ("host", "port", "path"):
            options.pop(key, None)
        master: aioredis.Redis = sentinel.master_for(
            sentinel_master,
            redis_class=_SentinelMaster,
            **_failing_fast(socket_timeout, connect_timeout, max_connections),
            **options,
        )
        return master
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        timeout=socket_timeout if socket_timeout is not None else 5.0,
        **_failing_fast(socket_timeout, connect_timeout, max_connections),
    )
    pool.connection_class = _TIMED.get(pool.connection_class, pool.connection_class)
    return aioredis.Redis.from_pool(pool)  # the client owns the pool: closed with it


def _cluster_client(
    url: str, socket_timeout: float | None, connect_timeout: float, max_connections: int
) -> aioredis.Redis:
    """A ``RedisCluster`` from one node's URL. A moved slot (``MOVED``/``ASK``, a failover) is
    followed at once; a node that does not answer is not retried here (the caller's own policy
    decides, as with one server), but the next command asks the cluster for its slots again."""
    client = ScriptingCluster.from_url(
        url, **_failing_fast(socket_timeout, connect_timeout, max_connections, retries=1)
    )
    # The nodes' connections send as the standalone client's do (``_TimedSend``); the nodes
    # the client discovers later take the class from the manager's keyword arguments.
    manager = client.nodes_manager
    plain = manager.connection_kwargs.get("connection_class", Connection)
    timed = _TIMED.get(plain, plain)
    manager.connection_kwargs["connection_class"] = timed
    client.connection_kwargs["connection_class"] = timed
    for node in manager.startup_nodes.values():
        node.connection_class = timed
    return cast(aioredis.Redis, client)


class _SentinelMaster(aioredis.Redis):
    """The master's client; closing it closes its connections to the Sentinels too."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        pool: Any = self.connection_pool
        await super().aclose(close_connection_pool)
        for sentinel in getattr(getattr(pool, "sentinel_manager", None), "sentinels", ()):
            await sentinel.aclose()


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def configured_client(
    settings: RedisSettings,
    url: str | None = None,
    *,
    socket_timeout: float | None = 1.0,
    connect_timeout: float = 0.5,
) -> aioredis.Redis:
    """``redis_client`` on the topology ``settings`` name; ``url``: another than
    ``settings.url`` (the embedded server's, always standalone)."""
    if url is not None and url != settings.url:
        return redis_client(url, socket_timeout=socket_timeout, connect_timeout=connect_timeout)
    assert settings.url is not None or settings.mode == "sentinel"
    return redis_client(
        settings.url or "redis://",
        socket_timeout=socket_timeout,
        connect_timeout=connect_timeout,
        mode=settings.mode,
        sentinels=settings.sentinels,
        sentinel_master=settings.sentinel_master,
    )


def blocking_client(settings: RedisSettings, url: str | None = None) -> aioredis.Redis:
    """The client of the blocking reads (``BLOCKING_READ_S``): a read's socket timeout is the
    block plus ``redis.command_timeout_s``, so a read on a server that stopped answering
    without closing its connections (a host gone, a partition) fails that soon and is made
    again on a new connection, instead of holding replies or ledger rows for longer."""
    bound = settings.command_timeout_s
    return configured_client(
        settings, url, socket_timeout=BLOCKING_READ_S + bound, connect_timeout=bound / 2
    )
