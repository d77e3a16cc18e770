"""Two in-memory copies (as two gateway processes hold them) over one database (SQLite, then
PostgreSQL: ``store_url``, tests/gateway/conftest.py) and the real Redis: changes reach the
other copy through pub/sub + the version counter."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
import redis.asyncio as aioredis
from sqlalchemy import update

from gateway.auth.admin import AuthAdmin
from gateway.auth.changes import AuthChanges
from gateway.auth.runtime import RuntimeAuth
from gateway.auth.schema import tenants
from gateway.auth.store import SqlAuthStore
from gateway.auth.tenants import TenantProfile
from tests.support import until


@pytest.fixture
async def pair(
    store_url: str, redis_url: str, key_prefix: str
) -> AsyncIterator[tuple[AuthAdmin, RuntimeAuth, RuntimeAuth]]:
    stores = [await SqlAuthStore.connect(store_url) for _ in range(2)]
    clients = [aioredis.Redis.from_url(redis_url) for _ in range(2)]
    copies = [
        RuntimeAuth(s, AuthChanges(c, key_prefix), flush_s=0.1)
        for s, c in zip(stores, clients, strict=True)
    ]
    for copy in copies:
        await copy.start()
    try:
        yield AuthAdmin(stores[0], copies[0].changes, copies[0]), copies[0], copies[1]
    finally:
        for copy in copies:
            await copy.aclose()
        for client in clients:
            await client.aclose()
        for store in stores:
            await store.aclose()


async def test_revocation_reaches_the_other_copy_within_a_second(
    pair: tuple[AuthAdmin, RuntimeAuth, RuntimeAuth],
) -> None:
    admin, here, there = pair
    issued = await admin.create_key("app", ["tenant:acme"])
    assert here.authenticate(issued.key) is not None  # the writer's copy at once
    await until(lambda: there.authenticate(issued.key) is not None)
    principal = there.authenticate(issued.key)
    assert principal is not None and principal.tenant == "acme" and principal.name == "app"
    await admin.revoke_key(issued.record.key_id)
    assert here.authenticate(issued.key) is None
    took = await until(lambda: there.authenticate(issued.key) is None)
    assert took < 1.0


async def test_a_missed_message_is_caught_by_the_version_check(
    pair: tuple[AuthAdmin, RuntimeAuth, RuntimeAuth],
) -> None:
    admin, _here, there = pair
    issued = await admin.store.create_key("app", ["tenant:acme"])  # SQL only: nobody told
    await asyncio.sleep(0.3)
    assert there.authenticate(issued.key) is None
    await admin.changes.redis.incr(admin.changes.version_key)  # the counter alone, no message
    await until(lambda: there.authenticate(issued.key) is not None, timeout_s=1.0)


async def test_rotated_key_stops_when_its_window_closes(
    pair: tuple[AuthAdmin, RuntimeAuth, RuntimeAuth],
) -> None:
    admin, _here, there = pair
    old = await admin.create_key("app", ["tenant:acme"])
    new = await admin.rotate_key(old.record.key_id, overlap=timedelta(seconds=1))
    await until(lambda: there.authenticate(new.key) is not None)
    assert there.authenticate(old.key) is not None  # inside the window both work
    await asyncio.sleep(1.1)
    assert there.authenticate(old.key) is None
    assert there.authenticate(new.key) is not None


async def test_tampered_and_unknown_keys_are_refused(
    pair: tuple[AuthAdmin, RuntimeAuth, RuntimeAuth],
) -> None:
    admin, here, _there = pair
    issued = await admin.create_key("app", ["tenant:acme"])
    flipped = issued.key[:-1] + ("A" if issued.key[-1] != "A" else "B")
    assert here.authenticate(flipped) is None
    assert here.authenticate("tgk_000000000000_" + "a" * 43) is None
    assert here.authenticate("") is None


async def test_last_used_is_written_in_batches(
    pair: tuple[AuthAdmin, RuntimeAuth, RuntimeAuth],
) -> None:
    admin, here, _there = pair
    issued = await admin.create_key("app", ["tenant:acme"])
    assert (await admin.store.get_key(issued.record.key_id)).last_used_at is None
    for _ in range(100):
        assert here.authenticate(issued.key) is not None
    deadline = time.monotonic() + 3
    while (await admin.store.get_key(issued.record.key_id)).last_used_at is None:
        assert time.monotonic() < deadline, "last-used never written"
        await asyncio.sleep(0.05)


async def test_tenants_reach_the_listener(
    pair: tuple[AuthAdmin, RuntimeAuth, RuntimeAuth],
) -> None:
    admin, _here, there = pair
    await admin.create_tenant("umbrella", TenantProfile(priority="batch"))
    await until(lambda: "umbrella" in there.tenants)
    assert there.tenants["umbrella"].profile.priority == "batch"


async def test_a_tenant_whose_row_goes_bad_keeps_its_last_settings(
    pair: tuple[AuthAdmin, RuntimeAuth, RuntimeAuth],
) -> None:
    """The row is broken by hand in SQL: the copies keep what they had for it, and go on
    reloading everything else (a revocation still arrives)."""
    admin, _here, there = pair
    await admin.create_tenant("umbrella", TenantProfile(priority="batch"))
    await until(lambda: "umbrella" in there.tenants)
    async with admin.store._engine.begin() as conn:
        await conn.execute(
            update(tenants).where(tenants.c.name == "umbrella").values(profile={"weight": -1})
        )
    issued = await admin.create_key("app", ["tenant:acme"])  # a change: every copy reloads
    await until(lambda: there.authenticate(issued.key) is not None)
    assert there.tenants["umbrella"].profile.priority == "batch"
    await admin.revoke_key(issued.record.key_id)
    await until(lambda: there.authenticate(issued.key) is None, timeout_s=1.0)


async def test_the_reload_loop_survives_an_unexpected_error(
    store_url: str, redis_url: str, key_prefix: str
) -> None:
    """Whatever a reload raises, the loop that carries revocations to this process goes on."""
    store = await SqlAuthStore.connect(store_url)
    client = aioredis.Redis.from_url(redis_url)
    failures: list[Exception] = []

    def listener(_tenants: object) -> None:
        if failures:
            raise failures.pop()

    copy = RuntimeAuth(store, AuthChanges(client, key_prefix), poll_s=0.05, on_tenants=listener)
    admin = AuthAdmin(store, copy.changes, None)
    try:
        await copy.start()
        failures.append(RuntimeError("a listener bug"))
        issued = await store.create_key("app", ["tenant:acme"])  # SQL only
        await copy.changes.announce()  # this reload raises in the listener
        await until(lambda: not failures)
        await copy.changes.announce()
        await until(lambda: copy.authenticate(issued.key) is not None, timeout_s=2.0)
        await admin.revoke_key(issued.record.key_id)
        await until(lambda: copy.authenticate(issued.key) is None, timeout_s=2.0)
    finally:
        await copy.aclose()
        await client.aclose()
        await store.aclose()
