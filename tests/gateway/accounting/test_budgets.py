"""Budgets on a real Redis: windows, worst case, the race for the last dollar, settlement, and
the release of reservations never settled."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
import yaml
from prometheus_client import generate_latest

from gateway.accounting import PriceBook
from gateway.accounting.budgets import BudgetBook, Released, window_bounds, worst_case_micro
from gateway.errors import BudgetBusy, BudgetExceeded
from gateway.metrics import Metrics
from gateway.services import Services
from gateway.settings import BudgetSettings, load_settings
from tests.gateway.accounting.apps import EXAMPLE, app_settings, auth, running_app
from tests.gateway.accounting.factories import make_entry
from tests.inprocess import inprocess_gateway

AT = datetime(2025, 3, 14, 9, 30, tzinfo=UTC)
SMALL = "llama-3.1-8b-instruct"


def tenants(*budgets: dict[str, Any]) -> dict[str, tuple[BudgetSettings, ...]]:
    return {"acme": tuple(BudgetSettings.model_validate(b) for b in budgets)}


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


def book(redis: aioredis.Redis, prefix: str, *budgets: dict[str, Any], **kw: Any) -> BudgetBook:
    prices = PriceBook.from_settings(load_settings(EXAMPLE).deployments, cost_map={})
    return BudgetBook(redis, prefix, tenants(*budgets), prices=prices, **kw)


@contextlib.asynccontextmanager
async def budgeted_gateway(
    redis_url: str, key_prefix: str, workdir: Path, limit_usd: str
) -> AsyncIterator[tuple[Services, httpx.AsyncClient]]:
    """The in-process gateway (``tests.inprocess``) with acme's one budget of ``limit_usd``."""

    def budget(config: dict[str, Any]) -> None:
        config["tenants"]["acme"]["budgets"] = [{"name": "the-budget", "limit_usd": limit_usd}]
        # Fifty requests at once on one event loop, on a machine busy with other tests: a reply
        # can wait past the production 1 s bound for the loop's turn. These tests are about the
        # race, not about failing fast when Redis is lost (tests/e2e/test_redis_outage.py).
        config["redis"]["command_timeout_s"] = 10

    async with inprocess_gateway(redis_url, key_prefix, workdir, edit=budget) as (services, _, c):
        yield services, c


def test_windows() -> None:
    assert window_bounds("month", AT) == (
        datetime(2025, 3, 1, tzinfo=UTC),
        datetime(2025, 4, 1, tzinfo=UTC),
    )
    start, end = window_bounds("7d", AT)
    assert (end - start).days == 7 and start <= AT < end
    assert window_bounds("1d", AT)[0] == datetime(2025, 3, 14, tzinfo=UTC)


def test_worst_case_is_the_dearest_deployment_of_the_plan() -> None:
    prices = PriceBook.from_settings(load_settings(EXAMPLE).deployments, cost_map={})
    # 70B: $0.35 / $0.70 per Mtok; a prompt bound of 100 tokens, 1000 output tokens.
    plan = ["llama-3.1-8b-instruct", "llama-3.1-70b-instruct-awq"]
    assert worst_case_micro(prices, plan, 100, 1000) == round(100 * 0.35 + 1000 * 0.70)
    # No max_tokens: as many as the deployment's context holds (the 70B: 8192); rounded up.
    assert worst_case_micro(prices, plan, 1, None) == 5735  # 0.35 + 8192 x 0.70 = 5734.75
    assert worst_case_micro(prices, ["gpt-4o-mini"], 100, 1000) == 0  # unknown price here
    # n = 3 answers: the prompt is billed once, each answer up to max_tokens.
    assert worst_case_micro(prices, plan, 100, 1000, choices=3) == round(100 * 0.35 + 3000 * 0.70)


async def test_fifty_requests_racing_the_last_dollar_never_overshoot(
    redis: aioredis.Redis, key_prefix: str
) -> None:
    budgets = book(redis, key_prefix, {"name": "monthly", "limit_usd": "1.00"})
    await budgets.settle(make_entry("earlier", created_at=AT, cost_micro_usd=990_000))

    async def attempt(i: int) -> bool:
        try:
            await budgets.reserve(
                tenant="acme", request_id=f"r{i}", app=None, tags=(), amount_micro_usd=4_000, at=AT
            )
        except BudgetBusy as exc:  # it would fit once the two in flight settle
            assert exc.status == 429 and exc.code == "budget_busy" and exc.retryable
            return False
        return True

    admitted = await asyncio.gather(*(attempt(i) for i in range(50)))
    assert sum(admitted) == 2  # 990_000 + 2 x 4_000 <= 1_000_000 < 990_000 + 3 x 4_000
    (status,) = await budgets.status("acme", AT)
    assert status.spent_micro_usd + status.reserved_micro_usd <= status.limit_micro_usd
    for i, ok in enumerate(admitted):
        if ok:
            await budgets.settle(make_entry(f"r{i}", created_at=AT, cost_micro_usd=3_000))
    (status,) = await budgets.status("acme", AT)
    assert (status.spent_micro_usd, status.reserved_micro_usd) == (996_000, 0)
    await budgets.reserve(  # what was busy fits now
        tenant="acme", request_id="retry", app=None, tags=(), amount_micro_usd=4_000, at=AT
    )
    await budgets.settle(make_entry("retry", created_at=AT, cost_micro_usd=4_000))
    with pytest.raises(BudgetExceeded) as spent:  # truly spent: no retry helps
        await budgets.reserve(
            tenant="acme", request_id="late", app=None, tags=(), amount_micro_usd=1, at=AT
        )
    assert spent.value.code == "budget_exceeded" and spent.value.retryable is False


async def test_settle_is_once_per_request_and_unknown_cost_keeps_the_reservation(
    redis: aioredis.Redis, key_prefix: str
) -> None:
    budgets = book(redis, key_prefix, {"name": "m", "limit_usd": "10"})
    for rid in ("a", "b"):
        await budgets.reserve(
            tenant="acme", request_id=rid, app=None, tags=(), amount_micro_usd=5_000, at=AT
        )
    entry = make_entry("a", created_at=AT, cost_micro_usd=1_234)
    await budgets.settle(entry)
    await budgets.settle(entry)  # a replayed write changes nothing
    await budgets.settle(make_entry("b", created_at=AT, cost_micro_usd=None, price_known=False))
    (status,) = await budgets.status("acme", AT)
    assert (status.spent_micro_usd, status.reserved_micro_usd) == (1_234 + 5_000, 0)


async def test_soft_and_scoped_budgets_and_alerts(redis: aioredis.Redis, key_prefix: str) -> None:
    metrics = Metrics()
    budgets = book(
        redis,
        key_prefix,
        {"name": "soft", "limit_usd": "0.01", "mode": "soft", "alert_at": [0.5, 1.0]},
        {"name": "bot", "limit_usd": "0.001", "app": "bot"},
        {"name": "eu", "limit_usd": "0.001", "tag": "eu"},
        metrics=metrics,
    )
    # Soft never refuses; the app and tag budgets only see their own requests.
    await budgets.reserve(
        tenant="acme", request_id="x", app="web", tags=("us",), amount_micro_usd=50_000, at=AT
    )
    with pytest.raises(BudgetExceeded, match="'bot'"):
        await budgets.reserve(
            tenant="acme", request_id="y", app="bot", tags=(), amount_micro_usd=2_000, at=AT
        )
    with pytest.raises(BudgetExceeded, match="'eu'"):
        await budgets.reserve(
            tenant="acme", request_id="z", app="web", tags=("eu",), amount_micro_usd=2_000, at=AT
        )
    await budgets.settle(make_entry("x", created_at=AT, app="web", cost_micro_usd=6_000))
    text = generate_latest(metrics.registry).decode()
    assert 'tiergate_budget_spent_ratio{budget="soft",tenant="acme"} 0.6' in text
    assert 'tiergate_budget_alert{budget="soft",tenant="acme",threshold="0.5"} 1.0' in text
    assert 'tiergate_budget_alert{budget="soft",tenant="acme",threshold="1"} 0.0' in text
    assert 'tiergate_budget_refusals_total{budget="bot",tenant="acme"} 1.0' in text


async def test_edge_refuses_with_429_budget_exceeded(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["tenants"]["acme"]["budgets"] = [{"name": "tiny", "limit_usd": "0.000001"}]
    settings = app_settings(redis_url, key_prefix, tmp_path, tenants=data["tenants"])
    async with running_app(settings) as (services, client):
        r = await client.post(
            "/v1/chat/completions",
            headers=auth("acme"),
            json={"model": "small", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert r.status_code == 429, r.text
        assert r.json()["error"]["code"] == "budget_exceeded"
        request_id = r.headers["x-request-id"]
        for _ in range(100):  # booked through the stream; no sink runs here, so read it
            if await services.redis.xlen(services.redis_keys.ledger_events):
                break
            await asyncio.sleep(0.02)
        assert await services.redis.xlen(services.redis_keys.ledger_events) == 1
        assert request_id


async def test_after_a_redis_loss_windows_are_rebuilt_from_the_sql_ledger(
    redis: aioredis.Redis, key_prefix: str, tmp_path: Path
) -> None:
    from gateway.accounting.ledger import SqlLedger

    ledger = await SqlLedger.connect(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}")
    try:
        earlier = datetime(2025, 3, 2, tzinfo=UTC)  # same month as AT
        last_month = datetime(2025, 2, 27, tzinfo=UTC)
        await ledger.record_many(
            [
                make_entry("old1", created_at=earlier, cost_micro_usd=700_000),
                make_entry("old2", created_at=earlier, cost_micro_usd=150_000, app="web"),
                make_entry("old3", created_at=earlier, cost_micro_usd=90_000, tags=("eu",)),
                make_entry("feb", created_at=last_month, cost_micro_usd=5_000_000),
                make_entry("other", created_at=earlier, tenant="globex", cost_micro_usd=9_000_000),
            ]
        )
        budgets = {"name": "month", "limit_usd": "1"}
        web = {"name": "web", "limit_usd": "0.2", "app": "web"}
        eu = {"name": "eu", "limit_usd": "0.1", "tag": "eu"}
        # Redis holds nothing of these windows (a fresh key prefix: as after Redis lost them).
        rebuilt = book(redis, key_prefix, budgets, web, eu, ledger=ledger)
        with pytest.raises(BudgetExceeded, match="'month'"):  # 0.94 booked this month
            await rebuilt.reserve(
                tenant="acme", request_id="big", app=None, tags=(), amount_micro_usd=100_000, at=AT
            )
        with pytest.raises(BudgetExceeded, match="'web'"):  # 0.15 of web's 0.2
            await rebuilt.reserve(
                tenant="acme", request_id="w", app="web", tags=(), amount_micro_usd=55_000, at=AT
            )
        with pytest.raises(BudgetExceeded, match="'eu'"):  # 0.09 of eu's 0.1
            await rebuilt.reserve(
                tenant="acme",
                request_id="e",
                app=None,
                tags=("eu",),
                amount_micro_usd=20_000,
                at=AT,
            )
        await rebuilt.reserve(
            tenant="acme", request_id="small", app=None, tags=(), amount_micro_usd=50_000, at=AT
        )
        status = {s.name: s for s in await rebuilt.status("acme", AT)}
        assert status["month"].spent_micro_usd == 940_000
        assert status["web"].spent_micro_usd == 150_000
        assert status["eu"].spent_micro_usd == 90_000
        # Seeded once: another process (a second book) does not add it again.
        again = book(redis, key_prefix, budgets, web, eu, ledger=ledger)
        await again.reserve(
            tenant="acme", request_id="small2", app=None, tags=(), amount_micro_usd=1_000, at=AT
        )
        status = {s.name: s for s in await again.status("acme", AT)}
        assert status["month"].spent_micro_usd == 940_000
        assert status["month"].reserved_micro_usd == 51_000
    finally:
        await ledger.aclose()


async def test_fifty_chat_requests_racing_the_last_dollar_through_the_gateway(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    """The same race through ``POST /v1/chat/completions``: real services and workers, a real
    simulator over HTTP, the ledger in SQLite. Room for about three worst cases at a time: what
    the admitted requests cost in the ledger stays within the limit, every other one is a 429
    ``budget_exceeded``, and each of the fifty has its row."""
    from sqlalchemy import func, select

    from gateway.accounting.schema import ledger_entries

    limit_micro = 200  # $0.0002; a worst case here is ~61 µ$ (1000 output tokens at $0.06/Mtok)
    body = {
        "model": SMALL,
        "messages": [{"role": "user", "content": "Explain how budgets work, in detail."}],
        "max_tokens": 1000,
    }
    async with budgeted_gateway(redis_url, key_prefix, tmp_path, "0.0002") as (services, client):
        replies = await asyncio.gather(
            *(
                client.post("/v1/chat/completions", json=body, headers=auth("acme"))
                for _ in range(50)
            )
        )
        ok = [r for r in replies if r.status_code == 200]
        refused = [r for r in replies if r.status_code != 200]
        assert ok, [r.text for r in replies[:3]]
        assert refused, "the limit admitted every request: it did not bite"
        for r in refused:  # busy while the admitted ones are in flight: a retry may fit
            assert r.status_code == 429, r.text
            assert r.json()["error"]["code"] in ("budget_busy", "budget_exceeded")
        for _ in range(200):  # the sink books through the event stream
            async with services.ledger.engine.connect() as conn:
                rows = (
                    await conn.execute(select(func.count()).select_from(ledger_entries))
                ).scalar_one()
            if rows >= 50:
                break
            await asyncio.sleep(0.05)
        assert rows == 50
        booked = [await services.ledger.get(r.headers["x-request-id"]) for r in ok]
        spent = sum(entry.cost_micro_usd or 0 for entry in booked if entry is not None)
        assert all(entry is not None and entry.price_known for entry in booked)
        assert 0 < spent <= limit_micro, (len(ok), spent)
        (status,) = await services.budgets.status("acme")
        assert status.spent_micro_usd + status.reserved_micro_usd <= status.limit_micro_usd


async def test_the_openai_sdk_does_not_retry_a_spent_budget(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    """The official client retries every 429 twice by its own rule; a spent hard budget says
    ``x-should-retry: false``, so the client raises at once: one request sent, one row."""
    import openai
    from sqlalchemy import func, select

    from gateway.accounting.schema import ledger_entries

    sent: list[httpx.Request] = []

    async def count(request: httpx.Request) -> None:
        sent.append(request)

    async with budgeted_gateway(redis_url, key_prefix, tmp_path, "0.00001") as (services, c):
        http = httpx.AsyncClient(
            transport=c._transport, timeout=60, event_hooks={"request": [count]}
        )
        api = openai.AsyncOpenAI(
            base_url="http://tiergate/v1", api_key="dev-acme", http_client=http
        )
        with pytest.raises(openai.RateLimitError) as refused:
            await api.chat.completions.create(
                model=SMALL, messages=[{"role": "user", "content": "hi"}], max_tokens=1000
            )
        await http.aclose()
        assert refused.value.code == "budget_exceeded"
        assert refused.value.response.headers["x-should-retry"] == "false"
        assert len(sent) == 1
        for _ in range(200):
            async with services.ledger.engine.connect() as conn:
                rows = (
                    await conn.execute(select(func.count()).select_from(ledger_entries))
                ).scalar_one()
            if rows:
                break
            await asyncio.sleep(0.05)
        assert rows == 1


async def test_a_repeat_answered_from_its_first_request_holds_no_reservation(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    """An idempotent repeat reserves its worst case like any request, but runs nothing and has
    no ledger row: its reservation is settled at no cost when its answer is replayed, not left
    for the sweep."""
    body = {"model": SMALL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}
    headers = {**auth("acme"), "idempotency-key": "order-7"}
    async with budgeted_gateway(redis_url, key_prefix, tmp_path, "10") as (services, client):
        assert services.budgets is not None
        first = await client.post("/v1/chat/completions", json=body, headers=headers)
        assert first.status_code == 200, first.text
        for _ in range(200):  # the first request's booking settles its reservation
            (status,) = await services.budgets.status("acme")
            if status.reserved_micro_usd == 0 and status.spent_micro_usd > 0:
                break
            await asyncio.sleep(0.02)
        spent = status.spent_micro_usd
        assert status.reserved_micro_usd == 0 and spent > 0
        repeat = await client.post("/v1/chat/completions", json=body, headers=headers)
        assert repeat.status_code == 200, repeat.text
        assert repeat.json()["id"] == first.json()["id"]  # the first one's answer
        (status,) = await services.budgets.status("acme")
        assert (status.spent_micro_usd, status.reserved_micro_usd) == (spent, 0)


async def reserve(budgets: BudgetBook, request_id: str, micro_usd: int, at: Any = AT) -> None:
    await budgets.reserve(
        tenant="acme", request_id=request_id, app=None, tags=(), amount_micro_usd=micro_usd, at=at
    )


async def spent_and_reserved(budgets: BudgetBook, at: datetime | None = AT) -> tuple[int, int]:
    (status,) = await budgets.status("acme", at)
    return status.spent_micro_usd, status.reserved_micro_usd


async def test_a_reservation_never_settled_is_released_after_its_bound_and_admits_again(
    redis: aioredis.Redis, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = Metrics()
    hard = {"name": "monthly", "limit_usd": "0.01"}  # 10_000 uUSD
    live = book(redis, key_prefix, hard)  # the default bound: not due during this test
    lost = book(redis, key_prefix, hard, metrics=metrics, release_after_s=0.3)
    await reserve(live, "live", 1_000)
    await reserve(lost, "lost", 8_000)  # its process dies: it is never settled
    with pytest.raises(BudgetBusy, match="'monthly'"):
        await reserve(live, "next", 5_000)
    assert await lost.sweep() == []  # not due yet
    assert await spent_and_reserved(live) == (0, 9_000)

    await asyncio.sleep(0.35)  # past the bound
    with caplog.at_level(logging.WARNING, logger="gateway.accounting.budgets"):
        assert await lost.sweep() == [Released("acme", 1, 8_000)]
    assert await spent_and_reserved(live) == (0, 1_000)  # what it was before "lost"
    await reserve(live, "next", 5_000)  # what was refused is admitted
    assert await spent_and_reserved(live) == (0, 6_000)
    (line,) = [r.getMessage() for r in caplog.records if "released" in r.getMessage()]
    assert "tenant acme" in line and "$0.008" in line, line
    text = generate_latest(metrics.registry).decode()
    assert 'tiergate_budget_reservations_released_total{tenant="acme"} 1.0' in text
    assert await lost.sweep() == []  # released once


async def test_a_settlement_after_the_release_books_the_real_cost_once(
    redis: aioredis.Redis, key_prefix: str
) -> None:
    budgets = book(redis, key_prefix, {"name": "m", "limit_usd": "10"}, release_after_s=0)
    await reserve(budgets, "a", 5_000)
    await reserve(budgets, "b", 5_000)
    assert await budgets.sweep() == [Released("acme", 2, 10_000)]
    assert await spent_and_reserved(budgets) == (0, 0)

    entry = make_entry("a", created_at=AT, cost_micro_usd=1_234)
    await budgets.settle(entry)  # late (a job reclaimed long after): booked, nothing released
    await budgets.settle(entry)  # a replayed write changes nothing
    await budgets.settle(make_entry("b", created_at=AT, cost_micro_usd=None, price_known=False))
    assert await spent_and_reserved(budgets) == (1_234 + 5_000, 0)  # unknown: its reservation
    assert await budgets.sweep() == []
    assert await spent_and_reserved(budgets) == (1_234 + 5_000, 0)


async def test_a_release_after_the_settlement_changes_nothing(
    redis: aioredis.Redis, key_prefix: str
) -> None:
    budgets = book(redis, key_prefix, {"name": "m", "limit_usd": "10"}, release_after_s=0)
    await reserve(budgets, "a", 5_000)
    await budgets.settle(make_entry("a", created_at=AT, cost_micro_usd=1_234))
    assert await spent_and_reserved(budgets) == (1_234, 0)
    assert await redis.zcard(f"{key_prefix}:{{budget:acme}}:open") == 0  # settled: not open
    assert await budgets.sweep() == []  # nothing left to release
    assert await spent_and_reserved(budgets) == (1_234, 0)


async def test_sweepers_and_settlements_at_once_release_each_reservation_once(
    redis: aioredis.Redis, redis_url: str, key_prefix: str
) -> None:
    """Four sweepers, each with its own connection (as from four processes), start while four
    writers are settling half of the reservations: some settlements come before their release,
    the others after. Over more reservations than one release script takes."""
    n = 1_200
    budgets = {"name": "m", "limit_usd": "100"}
    mine = book(redis, key_prefix, budgets, release_after_s=0)
    for first in range(0, n, 100):
        await asyncio.gather(*(reserve(mine, f"r{i}", 1_000) for i in range(first, first + 100)))
    assert await spent_and_reserved(mine) == (0, n * 1_000)
    clients = [aioredis.Redis.from_url(redis_url) for _ in range(4)]
    try:
        books = [book(c, key_prefix, budgets, release_after_s=0) for c in clients]
        under_way = asyncio.Event()

        async def settle_evens(writer: BudgetBook, k: int) -> None:
            for done, i in enumerate(range(k * 2, n, 8)):  # writer k: r2k, r2k+8, ...
                await writer.settle(make_entry(f"r{i}", created_at=AT, cost_micro_usd=300))
                if done == 20:
                    under_way.set()

        async def sweep(sweeper: BudgetBook) -> list[Released]:
            await under_way.wait()
            return await sweeper.sweep()

        sweeps, _ = await asyncio.gather(
            asyncio.gather(*(sweep(b) for b in books)),
            asyncio.gather(*(settle_evens(b, k) for k, b in enumerate(books))),
        )
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))
    count = sum(r.reservations for sweep in sweeps for r in sweep)
    assert n // 2 < count < n  # the odd ones, and the evens whose release came first
    assert await spent_and_reserved(mine) == ((n // 2) * 300, 0)  # nothing twice, either way
    assert await mine.sweep() == []


async def test_an_edge_only_process_sweeps_and_the_budgets_report_shows_it(
    redis: aioredis.Redis, redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    """The sweep runs in every process that opens the services, here an edge without workers
    (``serve --no-workers``), and at once when it starts."""
    data = yaml.safe_load(EXAMPLE.read_text())
    hard = {"name": "monthly", "limit_usd": "0.01"}
    data["tenants"]["acme"]["budgets"] = [hard]
    settings = app_settings(redis_url, key_prefix, tmp_path, tenants=data["tenants"])
    lost = book(redis, key_prefix, hard, release_after_s=0)

    async def reserved_usd(client: httpx.AsyncClient) -> str:
        r = await client.get("/v1/reports/budgets", headers=auth("acme"))
        assert r.status_code == 200, r.text
        (row,) = [b for b in r.json()["budgets"] if b["budget"] == "monthly"]
        return str(row["reserved_usd"])

    # Another process has the sweep's turn: this one's first sweep (whenever it runs) passes.
    await redis.set(lost.sweep_key, "another-process", px=60_000)
    async with running_app(settings) as (services, client):
        await reserve(lost, "lost", 8_000, at=None)
        assert await reserved_usd(client) == "0.008000"
    await redis.delete(lost.sweep_key)  # the interval has passed: anyone's turn again
    async with running_app(settings) as (services, client):  # a restarted edge
        for _ in range(100):
            if await reserved_usd(client) == "0.000000":
                break
            await asyncio.sleep(0.02)
        assert await reserved_usd(client) == "0.000000"
        text = generate_latest(services.metrics.registry).decode()
        assert 'tiergate_budget_reservations_released_total{tenant="acme"} 1.0' in text
