"""``SqlAuthStore`` on a real SQLite file and on a real PostgreSQL database (``store_url``,
tests/gateway/conftest.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import insert, inspect, text
from sqlalchemy.engine import make_url

from gateway.auth.schema import tenants
from gateway.auth.store import SqlAuthStore
from gateway.auth.tenants import TenantProfile
from gateway.errors import Conflict, InvalidRequest, NotFound
from router.catalog import Tier


@pytest.fixture
async def store(store_url: str):  # type: ignore[no-untyped-def]
    store = await SqlAuthStore.connect(store_url)
    yield store
    await store.aclose()


async def test_tenants_round_trip(store: SqlAuthStore) -> None:
    created = await store.create_tenant("umbrella", TenantProfile(default_tier=Tier.LARGE))
    assert created.profile.default_tier is Tier.LARGE
    with pytest.raises(Conflict):
        await store.create_tenant("umbrella", TenantProfile())
    updated = await store.update_tenant("umbrella", {"priority": "batch", "threshold": 0.3})
    assert updated.profile.priority == "batch" and updated.profile.default_tier is Tier.LARGE
    assert [t.name for t in await store.list_tenants()] == ["umbrella"]
    with pytest.raises(InvalidRequest):
        await store.create_tenant("Bad Name!", TenantProfile())
    with pytest.raises(NotFound):
        await store.get_tenant("nobody")


async def test_profiles_stored_before_limits_and_budgets_load(store: SqlAuthStore) -> None:
    """Rows written before weights, rate limits, budgets and baselines existed (one with the
    ``monthly_budget_usd: 0`` that was accepted then) load, and update, as they are."""
    old = {
        "default_tier": "small",
        "allowed_tiers": ["small", "large", "external"],
        "allowed_models": None,
        "threshold": None,
        "priority": "standard",
        "monthly_budget_usd": "100",
        "log_prompts": False,
    }
    at = datetime(2025, 1, 1, tzinfo=UTC)
    async with store._engine.begin() as conn:
        for name, profile in (("old", old), ("zero", {**old, "monthly_budget_usd": "0"})):
            await conn.execute(
                insert(tenants).values(name=name, profile=profile, created_at=at, updated_at=at)
            )
    loaded = {t.name: t.profile for t in await store.list_tenants()}
    assert loaded["old"].weight == 1.0 and loaded["old"].budgets == ()
    assert [b.name for b in loaded["old"].all_budgets] == ["monthly"]
    assert loaded["zero"].monthly_budget_usd is None
    updated = await store.update_tenant("zero", {"requests_per_minute": 30})
    assert updated.profile.requests_per_minute == 30 and updated.profile.priority == "standard"


async def test_a_bad_stored_row_hides_no_other_tenant(store: SqlAuthStore) -> None:
    """A row edited by hand into something this version refuses is reported by name; fields it
    does not know (written by a newer version, before a rollback) are ignored."""
    at = datetime(2025, 1, 1, tzinfo=UTC)
    rows = {
        "good": {"priority": "batch"},
        "bad": {"weight": -1},
        "newer": {"priority": "interactive", "a_setting_from_a_later_version": 3},
    }
    async with store._engine.begin() as conn:
        for name, profile in rows.items():
            await conn.execute(
                insert(tenants).values(name=name, profile=profile, created_at=at, updated_at=at)
            )
    records, invalid = await store.load_tenants()
    assert invalid == ["bad"]
    loaded = {r.name: r.profile for r in records}
    assert loaded["good"].priority == "batch"
    assert loaded["newer"].priority == "interactive"
    assert sorted(t.name for t in await store.list_tenants()) == ["good", "newer"]


async def test_limits_budgets_and_baseline_round_trip(store: SqlAuthStore) -> None:
    profile = TenantProfile.model_validate(
        {
            "weight": 2.0,
            "requests_per_minute": 60,
            "tokens_per_minute": 5000,
            "baseline_model": "llama-3.1-70b-instruct-awq",
            "budgets": [{"name": "weekly", "limit_usd": "12.5", "window": "7d", "tag": "eu"}],
        }
    )
    await store.create_tenant("umbrella", profile)
    assert (await store.get_tenant("umbrella")).profile == profile
    changed = await store.update_tenant("umbrella", {"budgets": [], "monthly_budget_usd": "9"})
    assert changed.profile.budgets == () and changed.profile.weight == 2.0
    assert [b.name for b in (await store.get_tenant("umbrella")).profile.all_budgets] == ["monthly"]
    with pytest.raises(InvalidRequest, match="unique"):
        await store.update_tenant("umbrella", {"budgets": [{"name": "monthly", "limit_usd": 1}]})


async def test_null_puts_settings_back_to_their_defaults(store: SqlAuthStore) -> None:
    """What ``PATCH`` with ``null`` and ``tiergate tenants update --clear`` store."""
    profile = TenantProfile.model_validate(
        {
            "allowed_tiers": ["small"],
            "priority": "batch",
            "weight": 3,
            "requests_per_minute": 5,
            "budgets": [{"name": "weekly", "limit_usd": "1", "window": "7d"}],
            "monthly_budget_usd": "9",
            "log_prompts": True,
        }
    )
    await store.create_tenant("umbrella", profile)
    cleared = dict.fromkeys(
        ("allowed_tiers", "priority", "weight", "requests_per_minute", "budgets", "log_prompts")
    )
    changed = await store.update_tenant(
        "umbrella", {**cleared, "monthly_budget_usd": None, "threshold": 0.5}
    )
    assert changed.profile == TenantProfile(threshold=0.5)
    assert (await store.get_tenant("umbrella")).profile == TenantProfile(threshold=0.5)
    with pytest.raises(InvalidRequest) as refused:  # an unknown setting, even as null
        await store.update_tenant("umbrella", {"colour": None})
    assert refused.value.param == "colour"


async def test_key_is_stored_as_salted_hash_only(store: SqlAuthStore, store_url: str) -> None:
    issued = await store.create_key("ops-bot", ["tenant:umbrella"], note="ci")
    assert issued.key.startswith("tgk_") and issued.record.key_id in issued.key
    listed = await store.list_keys()
    assert [k.key_id for k in listed] == [issued.record.key_id]
    assert "digest" not in listed[0].public() and "salt" not in listed[0].public()
    secret = issued.key.split("_", 2)[2]
    async with store._engine.connect() as conn:
        stored = repr((await conn.execute(text("SELECT * FROM api_keys"))).all())
    assert issued.record.key_id in stored
    assert secret not in stored and issued.key not in stored
    url = make_url(store_url)
    if url.get_backend_name() == "sqlite":  # and not in the file's bytes either
        raw = _file_bytes(Path(str(url.database)))
        assert secret.encode() not in raw and issued.key.encode() not in raw


def _file_bytes(db: Path) -> bytes:
    """A SQLite database's bytes, its write-ahead log included."""
    wal = db.with_name(db.name + "-wal")
    return db.read_bytes() + (wal.read_bytes() if wal.exists() else b"")


async def test_roles_are_checked(store: SqlAuthStore) -> None:
    for roles in ([], ["superuser"], ["tenant:"], ["tenant:Bad Name"]):
        with pytest.raises(InvalidRequest):
            await store.create_key("x", roles)


async def test_rotation_sets_the_old_keys_window(store: SqlAuthStore) -> None:
    old = await store.create_key("app", ["tenant:acme"])
    before = datetime.now(UTC)
    new = await store.rotate_key(old.record.key_id, overlap=timedelta(seconds=60))
    record = await store.get_key(old.record.key_id)
    assert record.replaced_by == new.record.key_id
    assert record.expires_at is not None
    assert before + timedelta(seconds=59) < record.expires_at < before + timedelta(seconds=62)
    assert new.record.roles == ("tenant:acme",) and new.record.principal == "app"
    await store.revoke_key(new.record.key_id)
    with pytest.raises(Conflict):
        await store.rotate_key(new.record.key_id, overlap=timedelta(0))


async def test_touch_batches_last_used(store: SqlAuthStore) -> None:
    a = await store.create_key("a", ["finance"])
    b = await store.create_key("b", ["admin"])
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    await store.touch({a.record.key_id: at, b.record.key_id: at + timedelta(seconds=1)})
    assert (await store.get_key(a.record.key_id)).last_used_at == at
    assert (await store.get_key(b.record.key_id)).last_used_at == at + timedelta(seconds=1)


async def test_deleting_a_tenant_revokes_its_keys(store: SqlAuthStore) -> None:
    await store.create_tenant("umbrella", TenantProfile())
    key = await store.create_key("u", ["tenant:umbrella"])
    other = await store.create_key("f", ["finance"])
    await store.delete_tenant("umbrella")
    assert (await store.get_key(key.record.key_id)).revoked_at is not None
    assert (await store.get_key(other.record.key_id)).revoked_at is None


async def test_schema_creation_is_idempotent(store_url: str) -> None:
    for _ in range(2):
        store = await SqlAuthStore.connect(store_url)
        async with store._engine.connect() as conn:
            tables = await conn.run_sync(lambda sync: inspect(sync).get_table_names())
        await store.aclose()
    assert {"tenants", "api_keys"} <= set(tables)
