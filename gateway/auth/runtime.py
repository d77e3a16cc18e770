"""``RuntimeAuth``: this process's in-memory copy of the run-time keys and tenants.

Authentication is a dictionary lookup and one SHA-256, with no I/O. The copy is reloaded from
SQL whenever the Redis version counter moves (a pub/sub message wakes the loop at once; the
counter is also polled every ``poll_s``, so a missed message costs one poll) and every
``full_reload_s`` regardless (the backstop while Redis is down). A revoked key is therefore
refused by every process within about a round trip plus one SQL read. Expiry (the end of a
rotation window) needs no message: it is checked against the clock on every lookup.

A tenant whose stored settings do not load (a row edited by hand) is logged and keeps the
settings this process last loaded for it; the other tenants and every key reload as usual, and
the reload loop survives any error, since it is what carries revocations here.

Last-used times are collected in memory and written in one batched UPDATE every
``flush_s`` (and at shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from redis.asyncio.client import PubSub
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

from gateway.auth.changes import AuthChanges
from gateway.auth.principals import Principal
from gateway.auth.store import SqlAuthStore
from gateway.auth.tenants import KeyRecord, TenantRecord
from gateway.auth.tokens import key_id_of, matches
from gateway.loops import Loop

__all__ = ["RuntimeAuth"]

log = logging.getLogger(__name__)

TenantsListener = Callable[[Mapping[str, TenantRecord]], None]


class RuntimeAuth:
    def __init__(
        self,
        store: SqlAuthStore,
        changes: AuthChanges,
        *,
        poll_s: float = 0.25,
        full_reload_s: float = 30.0,
        flush_s: float = 5.0,
        on_tenants: TenantsListener | None = None,
    ) -> None:
        self.store = store
        self.changes = changes
        self._poll_s = poll_s
        self._full_reload_s = full_reload_s
        self._flush_s = flush_s
        self._on_tenants = on_tenants
        self._keys: dict[str, KeyRecord] = {}
        self._principals: dict[str, Principal] = {}
        self._tenants: dict[str, TenantRecord] = {}
        self._version: int | None = None
        self._loaded_at = 0.0
        self._used: dict[str, datetime] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._flusher = Loop(
            "auth-last-used",
            self.flush,
            every_s=self._flush_s,
            pause_first=True,
            catch=(SQLAlchemyError, OSError),
            on_error=lambda exc: log.warning(
                "auth: cannot record last-used times: %s", type(exc).__name__
            ),
        )
        self._closing = False

    # the request path (no I/O)

    def authenticate(self, key: str) -> Principal | None:
        key_id = key_id_of(key)
        record = self._keys.get(key_id) if key_id is not None else None
        if record is None or not matches(key, record.salt, record.digest):
            return None
        now = datetime.now(UTC)
        if not record.usable_at(now):
            return None
        self._used[record.key_id] = now
        return self._principals[record.key_id]

    @property
    def tenants(self) -> Mapping[str, TenantRecord]:
        return self._tenants

    @property
    def version(self) -> int | None:
        return self._version

    # keeping the copy fresh

    async def reload(self, version: int | None = None) -> None:
        keys = await self.store.list_keys()
        tenants, invalid = await self.store.load_tenants()
        loaded = {t.name: t for t in tenants}
        for name in invalid:  # keeps the settings it had (none: unknown until fixed)
            if name in self._tenants:
                loaded[name] = self._tenants[name]
        self._keys = {r.key_id: r for r in keys if r.revoked_at is None}
        self._principals = {k: r.to_principal() for k, r in self._keys.items()}
        self._tenants = loaded
        if version is not None:
            self._version = version
        self._loaded_at = time.monotonic()
        if self._on_tenants is not None:
            self._on_tenants(self._tenants)

    async def start(self) -> None:
        """Load once (failing loudly if SQL is unusable), then keep fresh in the background."""
        version: int | None = None
        with contextlib.suppress(RedisError, OSError):
            version = await self.changes.version()
        await self.reload(version)
        self._tasks = [asyncio.create_task(self._follow(), name="auth-follow")]
        self._flusher.start()

    async def aclose(self) -> None:
        # redis-py's PubSub.get_message can swallow a cancellation; the flag ends the loop anyway.
        self._closing = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self._flusher.aclose()
        with contextlib.suppress(SQLAlchemyError, OSError):
            await self.flush()

    async def flush(self) -> None:
        used, self._used = self._used, {}
        try:
            await self.store.touch(used)
        except BaseException:
            for key_id, at in used.items():  # keep them for the next try
                self._used.setdefault(key_id, at)
            raise

    async def _follow(self) -> None:
        pubsub: PubSub | None = None
        try:
            while not self._closing:
                try:
                    if pubsub is None:
                        pubsub = self.changes.redis.pubsub()
                        await pubsub.subscribe(self.changes.channel)
                    await pubsub.get_message(ignore_subscribe_messages=True, timeout=self._poll_s)
                    version = await self.changes.version()
                    if version != self._version or self._stale():
                        await self.reload(version)
                except (RedisError, OSError) as exc:
                    log.warning("auth: Redis unusable (%s); reloading from SQL on a timer", exc)
                    await _drop(pubsub)
                    pubsub = None
                    await asyncio.sleep(max(self._poll_s, 1.0))
                    if self._stale():
                        await self._reload_quietly()
                except SQLAlchemyError as exc:
                    log.warning("auth: cannot reload keys from SQL: %s", type(exc).__name__)
                    await asyncio.sleep(max(self._poll_s, 1.0))
                except Exception:
                    # Anything else (a bug, a row we cannot read): this loop is what carries
                    # revocations to this process, so it must not die.
                    log.exception("auth: reload failed")
                    await asyncio.sleep(max(self._poll_s, 1.0))
        finally:
            await _drop(pubsub)

    def _stale(self) -> bool:
        return time.monotonic() - self._loaded_at > self._full_reload_s

    async def _reload_quietly(self) -> None:
        try:
            await self.reload()
        except SQLAlchemyError as exc:
            log.warning("auth: cannot reload keys from SQL: %s", type(exc).__name__)
        except Exception:
            log.exception("auth: reload failed")


async def _drop(pubsub: PubSub | None) -> None:
    if pubsub is not None:
        with contextlib.suppress(RedisError, OSError):
            await pubsub.aclose()  # type: ignore[no-untyped-call]
