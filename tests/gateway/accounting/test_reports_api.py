"""``GET /v1/reports/costs`` over real services: scoping by principal, grouping, CSV."""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from gateway.accounting import Attempt
from gateway.services import Services
from tests.gateway.accounting.apps import app_settings, auth, running_app
from tests.gateway.accounting.factories import T0, make_entry

ROWS = [
    make_entry("a1", tenant="acme", rule="short-prompt", tags=("chat",)),
    make_entry("a2", tenant="acme", rule="default", created_at=T0 + timedelta(days=1)),
    make_entry("g1", tenant="globex", principal="tenant:globex", cost_micro_usd=1_000_000),
    make_entry("i1", tenant="initech", principal="tenant:initech", cost_micro_usd=7),
]


@pytest.fixture
async def api(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> AsyncIterator[tuple[Services, httpx.AsyncClient]]:
    async with running_app(app_settings(redis_url, key_prefix, tmp_path)) as (services, client):
        await services.ledger.record_many(ROWS)
        yield services, client


async def test_tenant_sees_only_itself(api: tuple[Services, httpx.AsyncClient]) -> None:
    _, client = api
    r = await client.get("/v1/reports/costs?group_by=tenant", headers=auth("acme"))
    assert r.status_code == 200
    body = r.json()
    assert body["tenant"] == "acme"
    assert [row["tenant"] for row in body["rows"]] == ["acme"]
    assert body["totals"]["requests"] == 2
    assert body["totals"]["cost_usd"] == "0.000060"


@pytest.mark.parametrize(
    "query",
    [
        "tenant=globex",
        "tenant=globex&group_by=tenant",
        "tenant=&group_by=tenant",
        "tenant=acme&tenant=globex",
        "tenant=GLOBEX",
        "tenant=globex&format=csv",
    ],
)
@pytest.mark.parametrize("report", ["costs", "what-if", "budgets"])
async def test_tenant_cannot_read_another_by_any_parameter(
    api: tuple[Services, httpx.AsyncClient], report: str, query: str
) -> None:
    _, client = api
    r = await client.get(f"/v1/reports/{report}?{query}", headers=auth("acme"))
    assert "globex" not in r.text
    assert "initech" not in r.text
    if r.status_code == 200:
        assert r.json()["tenant"] == "acme"
    else:
        assert r.status_code in (400, 403)


async def test_finance_and_admin_see_all_and_filter(
    api: tuple[Services, httpx.AsyncClient],
) -> None:
    _, client = api
    for who in ("finance", "admin"):
        r = await client.get("/v1/reports/costs?group_by=tenant", headers=auth(who))
        assert r.status_code == 200
        body = r.json()
        assert body["tenant"] is None
        assert [row["tenant"] for row in body["rows"]] == ["acme", "globex", "initech"]
        assert body["totals"]["cost_usd"] == "1.000067"
        one = await client.get("/v1/reports/costs?tenant=globex", headers=auth(who))
        assert one.json()["tenant"] == "globex"
        assert one.json()["totals"]["requests"] == 1


async def test_group_by_rule_and_dates(api: tuple[Services, httpx.AsyncClient]) -> None:
    _, client = api
    day = T0.date().isoformat()
    r = await client.get(
        f"/v1/reports/costs?from={day}&to={day}&group_by=rule&tenant=acme", headers=auth("finance")
    )
    assert r.status_code == 200
    assert [(row["rule"], row["requests"]) for row in r.json()["rows"]] == [("short-prompt", 1)]
    r = await client.get("/v1/reports/costs?group_by=day,tag", headers=auth("acme"))
    groups = [(row["day"], row["tag"]) for row in r.json()["rows"]]
    assert groups == [(day, "chat"), ((T0 + timedelta(days=1)).date().isoformat(), None)]


async def test_csv(api: tuple[Services, httpx.AsyncClient]) -> None:
    _, client = api
    r = await client.get("/v1/reports/costs?group_by=model&format=csv", headers=auth("finance"))
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert [(row["model"], row["cost_usd"], row["requests"]) for row in rows] == [
        ("llama-3.1-8b-instruct", "1.000067", "4")
    ]


@pytest.mark.parametrize(
    ("query", "status"),
    [
        ("group_by=nope", 400),
        ("group_by=day,day", 400),
        ("from=2025-13-01", 400),
        ("from=2025-03-02&to=2025-03-01", 400),
        ("format=xml", 400),
    ],
)
async def test_bad_parameters(
    api: tuple[Services, httpx.AsyncClient], query: str, status: int
) -> None:
    _, client = api
    r = await client.get(f"/v1/reports/costs?{query}", headers=auth("finance"))
    assert r.status_code == status, r.text


async def test_needs_a_key(api: tuple[Services, httpx.AsyncClient]) -> None:
    _, client = api
    assert (await client.get("/v1/reports/costs")).status_code == 401


async def test_what_if_is_scoped_like_costs(api: tuple[Services, httpx.AsyncClient]) -> None:
    _, client = api
    own = await client.get("/v1/reports/what-if", headers=auth("acme"))
    assert own.status_code == 200
    body = own.json()
    assert (body["tenant"], body["requests"]) == ("acme", 2)
    assert [s["name"] for s in body["scenarios"]] == [
        "as_routed",
        "all_external",
        "all_self_hosted",
    ]
    other = await client.get("/v1/reports/what-if?tenant=globex", headers=auth("acme"))
    assert other.status_code == 403
    everyone = await client.get("/v1/reports/what-if", headers=auth("finance"))
    assert everyone.json()["requests"] == 4


async def test_the_estimated_share_per_tenant_the_dashboard_shows(
    api: tuple[Services, httpx.AsyncClient],
) -> None:
    """The dashboard's "Estimated share by tenant" reads ``group_by=tenant``: per tenant, the
    requests booked in part from estimated usage and the cost priced from the estimates."""
    services, client = api
    hosted = Attempt("gpt-4o-mini", "timeout", 4000.0, 230, 0, "timed out", estimated=True)
    await services.ledger.record_many(
        [
            make_entry("e1", tenant="acme", cost_micro_usd=40, estimated_micro_usd=35,
                       attempts=(hosted,)),
            make_entry("e2", tenant="globex", principal="tenant:globex", cost_micro_usd=500_000,
                       estimated_micro_usd=250_000, attempts=(hosted,)),
        ]
    )  # fmt: skip
    r = await client.get("/v1/reports/costs?group_by=tenant", headers=auth("finance"))
    assert r.status_code == 200
    rows = {row["tenant"]: row for row in r.json()["rows"]}
    got = {t: (row["estimated"], row["estimated_usd"], row["cost_usd"]) for t, row in rows.items()}
    assert got == {
        "acme": (1, "0.000035", "0.000100"),
        "globex": (1, "0.250000", "1.500000"),
        "initech": (0, "0.000000", "0.000007"),
    }
    totals = r.json()["totals"]
    assert (totals["estimated"], totals["estimated_usd"]) == (2, "0.250035")
    own = await client.get("/v1/reports/costs?group_by=tenant", headers=auth("acme"))
    assert [(row["tenant"], row["estimated_usd"]) for row in own.json()["rows"]] == [
        ("acme", "0.000035")
    ]


async def test_gpu_rates_are_published_for_this_period_and_the_next(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    deployments = [
        d.model_copy(update={"gpu_hourly_usd": Decimal("1.20"), "gpu_expected_tokens_per_s": 400.0})
        if d.model == "llama-3.1-8b-instruct"
        else d
        for d in app_settings(redis_url, key_prefix, tmp_path).deployments
    ]
    settings = app_settings(redis_url, key_prefix, tmp_path, deployments=deployments)
    async with running_app(settings) as (_, client):
        r = await client.get("/v1/reports/gpu-rates", headers=auth("acme"))
        assert r.status_code == 200, r.text
        (pool,) = r.json()["pools"]
        assert pool["deployment"] == "llama-3.1-8b-instruct"
        current, ahead = pool["current"], pool["next"]
        assert current["basis"] == ahead["basis"] == "planned"
        # $1.20/h for the one replica at 400 tokens/s: 1.2 / 1.44M per token.
        assert Decimal(current["input_per_mtok"]) == Decimal("1.2") / Decimal("1.44")
        assert ahead["period_start"] == current["period_end"]
        assert current["id"].startswith("llama-3.1-8b-instruct@")


@pytest.mark.parametrize(
    "path", ["/v1/reports/costs", "/v1/reports/what-if", "/v1/rules/acme/figures"]
)
async def test_every_period_ending_before_it_starts_is_refused_alike(
    api: tuple[Services, httpx.AsyncClient], path: str
) -> None:
    _, client = api
    r = await client.get(f"{path}?from=2025-03-02&to=2025-03-01", headers=auth("finance"))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_request", "to")
    ok = await client.get(f"{path}?from=2025-03-01&to=2025-03-01", headers=auth("finance"))
    assert ok.status_code == 200, ok.text  # one day: from == to
