"""Deadline admission: a job that is not expected to start before its deadline is refused at once
(429 ``deadline_unreachable``), one with room is queued; the estimate per lane and tenant; and
an ``auto`` request the large tier cannot start in time spills (``spill:deadline``) instead.

The estimate and the rule are pure (``TierView``, ``DeadlineAdmission``); the snapshot's inputs
(per-tenant waiting jobs, a lane's drain rate) come from the real Redis; the end-to-end cases run
the gateway in process (real services and workers, simulators over HTTP, SQLite)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis.asyncio as aioredis

from gateway.errors import RateLimited
from gateway.queue.edge.deadline import DeadlineAdmission
from gateway.queue.edge.dispatcher import Dispatcher
from gateway.queue.edge.replies import ReplyRouter
from gateway.queue.edge.snapshot import QueueSnapshot, TierQueue, TierView
from gateway.queue.keys import RedisKeys
from gateway.queue.lanes import LaneQueue
from gateway.queue.replicas.capacity import SlotLeases
from gateway.services import Services
from router.catalog import Tier
from router.plan import RoutePlan
from tests.gateway.queue.conftest import job
from tests.inprocess import LARGE, SMALL, inprocess_gateway

KEY = {"authorization": "Bearer dev-acme"}
ADMIN = {"authorization": "Bearer dev-admin"}


def _view(**kw: Any) -> TierView:
    base: dict[str, Any] = {"capacity": 10, "service_s": 1.0, "held": 10}
    return TierView(**{**base, **kw})


def test_higher_lanes_go_first_and_lower_ones_do_not_count() -> None:
    view = _view(
        depth={"interactive": 20, "standard": 0, "batch": 500},
        tenant_waiting={"interactive": {"a": 20}, "batch": {"b": 500}},
    )
    # interactive: its own 0 queued + 1 per other tenant (fair share); batch never ahead
    assert view.ahead_of("interactive", "c") == (0, 1)
    assert view.ahead_of("standard", "c") == (20, 0)
    assert view.ahead_of("batch", "b") == (20, 500)
    assert view.start_in("standard", "c") == pytest.approx((20 + 0 + 1) * 1.0 / 10)
    assert view.start_in("batch", "b") == pytest.approx((20 + 500 + 1) * 1.0 / 10)


def test_fair_share_within_a_lane() -> None:
    view = _view(depth={"batch": 300}, tenant_waiting={"batch": {"flood": 290, "light": 10}})
    assert view.ahead_of("batch", "flood") == (0, 300)  # 290 own + up to 291 of light: capped
    assert view.ahead_of("batch", "light") == (0, 21)  # 10 own + 11 of flood's
    assert view.ahead_of("batch", "new") == (0, 2)  # one of each other tenant
    assert view.ahead_of("batch", "new", weight=2.0) == (0, 1)


def test_a_lane_drained_slower_than_capacity_waits_longer() -> None:
    view = _view(depth={"batch": 80}, tenant_waiting={"batch": {"b": 80}}, drain_rps={"batch": 4})
    # capacity says 81 / 10 s; the lane was drained at 4 jobs/s (interactive work took the rest)
    assert view.start_in("batch", "b") == pytest.approx(20.0)


@pytest.mark.parametrize(
    ("waiting", "time_left_s", "refused"),
    [
        (100, 5.0, True),  # 10.1 s of work ahead, 4 s of room
        (100, 30.0, False),  # room enough
        (100, 10.0, False),  # 10.1 s against 9 s of room: within the 25 % margin
        (100, 7.0, True),  # 10.1 s against 6 s x 1.25
        (10, 0.5, False),  # fewer than min_waiting ahead: never refused on the estimate
    ],
)
def test_the_rule(waiting: int, time_left_s: float, refused: bool) -> None:
    view = _view(depth={"batch": waiting}, tenant_waiting={"batch": {"b": waiting}})
    admission = DeadlineAdmission(lambda tier: view, margin=0.25, min_waiting=16)
    args: dict[str, Any] = {"tier": "small", "lane": "batch", "tenant": "b", "weight": 1.0}
    if not refused:
        admission.check(**args, time_left_s=time_left_s)
        return
    with pytest.raises(RateLimited) as info:
        admission.check(**args, time_left_s=time_left_s)
    assert info.value.code == "deadline_unreachable"
    assert info.value.retry_after == 11.0


async def test_the_snapshot_sees_each_tenants_waiting_jobs_and_the_lanes_drain_rate(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    keys = RedisKeys(key_prefix)
    slot = keys.slots("small", "m#0")
    tiers = {"small": TierQueue(capacity=4, slot_keys=(slot,), slot_deployments=("m",))}
    clock = [1000.0]
    snapshot = QueueSnapshot(redis_conn, keys, tiers, clock=lambda: clock[0])
    q = LaneQueue(redis_conn, keys)
    for n in range(12):
        tenant = "a" if n < 9 else "b"
        await q.enqueue(tier="small", lane="batch", tenant=tenant, job=b"x", weight=1, max_depth=99)
    await snapshot.refresh()
    view = snapshot.view("small")
    assert view.tenant_waiting["batch"] == {"a": 9, "b": 3}
    assert "batch" not in view.drain_rps  # not measured yet
    taken = [await q.take("small", "w", slot_keys=[slot], batch_limit=-1) for _ in range(5)]
    assert taken[0] is not None
    await q.not_started(taken[0])  # skipped by its worker: it did not start
    clock[0] += 5.0
    await snapshot.refresh()
    view = snapshot.view("small")
    assert sum(view.tenant_waiting["batch"].values()) == 7  # taken ones are pending, not waiting
    assert view.drain_rps["batch"] == pytest.approx(4 / 5.0)
    assert await redis_conn.get(keys.taken("small", "batch")) == b"4"


async def _fill(
    services: Services,
    key_prefix: str,
    jobs: int,
    *,
    tier: Tier = Tier.SMALL,
    model: str = SMALL,
    max_tokens: int = 300,
) -> list[tuple[str, str]]:
    """Hold every slot of ``tier`` (but the one a worker holds while idle, which takes the
    first job: a few seconds at the simulator's speed), queue ``jobs`` interactive jobs of
    another tenant for ``model``, and say a job takes 2 s: a standard-lane request of acme then
    waits about ``jobs`` x 2 s / slots."""
    assert services.queue_snapshot is not None
    spec = services.queue_snapshot.spec(tier)
    leases = SlotLeases(services.redis)
    held: list[tuple[str, str]] = []
    for key in spec.slot_keys:
        while await leases.acquire(key, f"test-{len(held)}", spec.capacity):
            held.append((key, f"test-{len(held)}"))
    lanes = LaneQueue(services.redis, services.redis_keys)
    plan = RoutePlan(tier=tier, deployments=(model,), rule="pin:tier", reason="filler")
    for n in range(jobs):
        filler = job(
            f"fill-{n}", "nobody", tenant="other", priority="interactive", max_tokens=max_tokens
        )
        filler = dataclasses.replace(filler, plan=plan, body={**filler.body, "model": model})
        await lanes.enqueue(
            tier=tier.value,
            lane="interactive",
            tenant="other",
            job=filler.encode(),
            weight=1.0,
            max_depth=1000,
        )
    await asyncio.sleep(0.3)  # a worker holding an idle slot may take one and publish its time
    await services.redis.set(services.redis_keys.service_time(tier.value), "2.0")
    await services.queue_snapshot.refresh()
    return held


async def _row(services: Services, request_id: str) -> Any:
    for _ in range(200):
        row = await services.ledger.get(request_id)
        if row is not None:
            return row
        await asyncio.sleep(0.05)
    return None


def _body() -> dict[str, Any]:
    return {"model": SMALL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def _no_admission(config: dict[str, Any]) -> None:
    config.setdefault("queue", {})["deadline_admission"] = False


async def test_refused_at_once_and_booked_once(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    async with inprocess_gateway(redis_url, key_prefix, tmp_path, time_scale=1.0) as (
        services,
        _app,
        client,
    ):
        await _fill(services, key_prefix, 40)
        assert services.queue_snapshot is not None
        expected = services.queue_snapshot.view("small").start_in("standard", "acme")
        assert expected > 2.0, services.queue_snapshot.view("small")

        started = time.monotonic()
        refused = await client.post(
            "/v1/chat/completions",
            json=_body(),
            headers={**KEY, "x-tiergate-timeout-ms": "1500"},
        )
        assert time.monotonic() - started < 1.0  # at once, not at the deadline
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "deadline_unreachable"
        assert int(refused.headers["retry-after"]) >= math.ceil(2.5)  # 40 jobs x 2 s / 32 slots
        row = await _row(services, refused.headers["x-request-id"])
        assert row is not None and row.status_code == 429
        assert row.outcome == "deadline_unreachable" and not row.attempts
        assert row.tier == "small"
        depth = await LaneQueue(services.redis, services.redis_keys).depths("small")
        assert depth["standard"] == 0  # never queued


@pytest.mark.slow
async def test_one_with_room_is_queued_and_served(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    async with inprocess_gateway(redis_url, key_prefix, tmp_path, time_scale=1.0) as (
        services,
        _app,
        client,
    ):
        held = await _fill(services, key_prefix, 40)
        roomy = asyncio.create_task(
            client.post(
                "/v1/chat/completions",
                json=_body(),
                headers={**KEY, "x-tiergate-timeout-ms": "60000"},
            )
        )
        await asyncio.sleep(0.5)
        assert not roomy.done()  # queued behind the interactive work, not refused
        leases = SlotLeases(services.redis)
        for key, lease in held:
            await leases.release(key, lease)
        served = await asyncio.wait_for(roomy, 30)
        assert served.status_code == 200, served.text
        row = await _row(services, served.headers["x-request-id"])
        assert row is not None and row.status_code == 200


async def test_with_the_setting_off_it_waits_for_its_504(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    async with inprocess_gateway(
        redis_url, key_prefix, tmp_path, time_scale=1.0, edit=_no_admission
    ) as (
        services,
        _app,
        client,
    ):
        await _fill(services, key_prefix, 40)
        started = time.monotonic()
        late = await client.post(
            "/v1/chat/completions",
            json=_body(),
            headers={**KEY, "x-tiergate-timeout-ms": "1500"},
        )
        assert late.status_code == 504, late.text
        assert time.monotonic() - started >= 1.4
        assert late.status_code == 504, late.text
        row = await _row(services, late.headers["x-request-id"])
        assert row is not None and row.status_code == 504


def _auto_goes_large(config: dict[str, Any]) -> None:
    for tenant in config["tenants"].values():
        tenant["threshold"] = 0.0  # every score is at or over it: auto traffic is bound large


def _openai(app: Any, tenant: str) -> openai.AsyncOpenAI:
    """The official client, talking to the in-process app."""
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), timeout=60)
    return openai.AsyncOpenAI(
        base_url="http://tiergate/v1", api_key=f"dev-{tenant}", http_client=http, max_retries=0
    )


async def _explain(client: httpx.AsyncClient, tenant: str, **headers: str) -> dict[str, Any]:
    reply = await client.post(
        "/v1/route/explain",
        json={"model": "auto", "messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": f"Bearer dev-{tenant}", **headers},
    )
    assert reply.status_code == 200, reply.text
    plan: dict[str, Any] = reply.json()
    return plan


async def test_a_short_deadline_spills_off_the_large_tier_instead_of_a_429(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    """An ``auto`` request bound for a large tier with about 5 s of work ahead, with 3 s to its
    deadline: acme, whose rules turn deadline spill-over off (as before it existed), is refused
    429 ``deadline_unreachable`` on the large tier; globex's, by default, spills to the small
    tier (the config has no external one) and is answered there, and its ledger row, headers
    and explain say ``spill:deadline``."""
    async with inprocess_gateway(
        redis_url,
        key_prefix,
        tmp_path,
        time_scale=1.0,
        edit=_auto_goes_large,
        models=(SMALL, LARGE),
    ) as (services, app, client):
        put = await client.put(
            "/v1/rules/acme", content="defaults: {spill_on_deadline: false}\n", headers=ADMIN
        )
        assert put.status_code == 200, put.text
        for _ in range(100):
            if (await _explain(client, "acme"))["rules_version"] == 1:
                break
            await asyncio.sleep(0.05)
        await _fill(services, key_prefix, 40, tier=Tier.LARGE, model=LARGE, max_tokens=60)
        assert services.queue_snapshot is not None
        wait = services.queue_snapshot.expected_wait("large")
        assert wait > 3.0, services.queue_snapshot.view("large")  # ~41 x 2 s / 16 slots
        short = {"x-tiergate-timeout-ms": "3000"}

        calm = await _explain(client, "globex")  # the default timeout (120 s): room enough
        assert (calm["tier"], calm["rule"]) == ("large", "auto:threshold")
        assert calm["timeout_ms"] == 120_000
        shown = await _explain(client, "globex", **short)
        assert (shown["tier"], shown["rule"]) == ("small", "spill:deadline")
        assert shown["timeout_ms"] == 3000
        assert shown["deployments"][0] == SMALL
        assert "; deadline in 3.0 s: large tier's expected wait " in shown["reason"]
        assert shown["reason"].endswith("does not fit → small"), shown["reason"]
        assert shown["signals"]["service_s"]["large"] > 0

        messages: Any = [{"role": "user", "content": "hi"}]
        before = _openai(app, "acme")
        with pytest.raises(openai.RateLimitError) as refused:
            await before.chat.completions.create(
                model="auto", messages=messages, max_tokens=8, extra_headers=short
            )
        assert refused.value.code == "deadline_unreachable"
        await before.close()
        row = await _row(services, refused.value.response.headers["x-request-id"])
        assert row is not None and row.status_code == 429
        assert (row.outcome, row.tier, row.rule) == (
            "deadline_unreachable", "large", "auto:threshold"
        )  # fmt: skip

        after = _openai(app, "globex")
        raw = await after.chat.completions.with_raw_response.create(
            model="auto", messages=messages, max_tokens=8, extra_headers=short
        )
        await after.close()
        await _answered_by_the_spill(services, raw)


async def _answered_by_the_spill(services: Services, raw: Any) -> None:
    """``raw`` (a raw chat response) was answered by the small tier, spilled there for its
    deadline, and its ledger row says so."""
    assert raw.parse().choices[0].message.content
    assert raw.headers["x-tiergate-rule"] == "spill:deadline"
    assert (raw.headers["x-tiergate-tier"], raw.headers["x-tiergate-model"]) == ("small", SMALL)
    row = await _row(services, raw.headers["x-request-id"])
    assert row is not None and (row.status_code, row.outcome) == (200, "ok")
    assert (row.tier, row.deployment, row.rule) == ("small", SMALL, "spill:deadline")


async def test_the_openai_sdks_own_short_timeout_is_the_deadline(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    """The official client built with ``timeout=3`` and no tiergate header: its non-streamed
    request's deadline is the SDK's read timeout less the margin (2.7 s), not the default 120 s,
    so with about 5 s of work queued on the large tier its ``auto`` request spills to the small
    tier (``spill:deadline``) and is answered there. A client with the SDK's default timeout
    (600 s) keeps the 120 s default and stays large."""
    async with inprocess_gateway(
        redis_url,
        key_prefix,
        tmp_path,
        time_scale=1.0,
        edit=_auto_goes_large,
        models=(SMALL, LARGE),
    ) as (services, app, _client):
        await _fill(services, key_prefix, 40, tier=Tier.LARGE, model=LARGE, max_tokens=60)
        assert services.queue_snapshot is not None
        wait = services.queue_snapshot.expected_wait("large")
        assert wait > 3.0, services.queue_snapshot.view("large")
        messages: Any = [{"role": "user", "content": "hi"}]
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), timeout=60)
        patient = openai.AsyncOpenAI(
            base_url="http://tiergate/v1", api_key="dev-globex", http_client=http, timeout=600
        )
        hasty = patient.with_options(timeout=3, max_retries=0)

        calm: Any = await patient.post(
            "/route/explain", cast_to=object, body={"model": "auto", "messages": messages}
        )
        assert (calm["timeout_ms"], calm["tier"], calm["rule"]) == (
            120_000, "large", "auto:threshold"
        )  # fmt: skip
        shown: Any = await hasty.post(
            "/route/explain", cast_to=object, body={"model": "auto", "messages": messages}
        )
        assert (shown["timeout_ms"], shown["tier"], shown["rule"]) == (
            2700, "small", "spill:deadline"
        )  # fmt: skip
        assert "; deadline in 2.7 s: large tier's expected wait " in shown["reason"]

        raw = await hasty.chat.completions.with_raw_response.create(
            model="auto", messages=messages, max_tokens=8
        )
        await patient.close()
        await _answered_by_the_spill(services, raw)


async def test_the_dispatcher_judges_the_tier_the_plan_queues_in(
    redis_conn: aioredis.Redis, key_prefix: str
) -> None:
    """Spill-over is the planner's, before the dispatcher: a request it moved off the crowded
    large tier is judged on the tier it moved to, and queued; one still bound for the large tier
    is refused there, and nothing is queued for it."""
    keys = RedisKeys(key_prefix)
    replies = ReplyRouter(redis_conn, keys.replies("e7"), block_ms=100)
    crowded = _view(depth={"standard": 200}, tenant_waiting={"standard": {"acme": 200}})
    views = {"large": crowded, "small": _view(held=0)}
    dispatcher = Dispatcher(
        redis_conn,
        keys,
        replies,
        max_depth=1000,
        claim_ttl_s=60,
        deadline=DeadlineAdmission(lambda tier: views[tier]),
    )
    bound = job("big", "e7", timeout_s=10)
    bound = dataclasses.replace(
        bound, plan=dataclasses.replace(bound.plan, tier=Tier.LARGE, rule="auto:threshold")
    )
    with pytest.raises(RateLimited) as info:
        await dispatcher.submit(bound)
    assert info.value.code == "deadline_unreachable"
    assert info.value.retry_after == 21.0  # (200 + 1) x 1 s / 10 slots
    lanes = LaneQueue(redis_conn, keys)
    assert (await lanes.depths("large"))["standard"] == 0

    spilled = job("moved", "e7", timeout_s=10)
    spilled = dataclasses.replace(
        spilled, plan=dataclasses.replace(spilled.plan, rule="spill:large_wait")
    )
    await dispatcher.submit(spilled)
    assert (await lanes.depths("small"))["standard"] == 1
