"""Every row says where its price came from, and tiny requests keep their cost: through the real
gateway and simulator, the SQLite ledger, the reports API and ``tiergate ledger show``."""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import io
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
from typer.testing import CliRunner

from gateway.accounting.events import encode_entry
from gateway.accounting.records import LedgerEntry
from gateway.accounting.reports import money_text
from gateway.accounting.rollups import rollup_day
from gateway.accounting.verify import verify_ledger
from gateway.cli.main import app
from gateway.services import Services
from tests.gateway.accounting.apps import auth
from tests.inprocess import SMALL, inprocess_gateway

TINY = {
    "model": SMALL,
    "messages": [{"role": "user", "content": "Hi there"}],
    "max_tokens": 1,
}


async def booked(services: Services, request_id: str) -> LedgerEntry:
    for _ in range(400):
        entry = await services.ledger.get(request_id)
        if entry is not None:
            return entry
        await asyncio.sleep(0.05)
    raise AssertionError(f"{request_id} never booked")


async def tiny(client: httpx.AsyncClient) -> str:
    r = await client.post("/v1/chat/completions", json=TINY, headers=auth("acme"))
    assert r.status_code == 200, r.text
    return r.headers["x-request-id"]


def test_money_text_keeps_micro_dollars_and_shows_nano_dollars() -> None:
    assert money_text(Decimal("0.00006")) == "0.000060"
    assert money_text(Decimal("0.00000039")) == "0.00000039"
    assert money_text(Decimal("12.5")) == "12.500000"
    assert money_text(Decimal("-0.000000001")) == "-0.000000001"


async def test_a_tiny_request_is_booked_to_the_nano_dollar_and_verify_is_clean(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    """About 13 tokens on the 8B ($0.03 / $0.06 per Mtok) cost under a micro-dollar: the row
    keeps it in nano-dollars, the report shows it, and ``ledger verify`` finds nothing."""
    async with inprocess_gateway(redis_url, key_prefix, tmp_path) as (services, _, client):
        entry = await booked(services, await tiny(client))
        tokens = entry.prompt_tokens + entry.completion_tokens
        assert 0 < tokens < 20
        exact = Decimal("0.03") * entry.prompt_tokens + Decimal("0.06") * entry.completion_tokens
        assert entry.cost_micro_usd == 0  # what micro-dollars alone kept
        assert entry.cost_nano_usd == int(exact * 1000)  # $/Mtok x tokens = micro; x1000 nano
        assert entry.cost_usd == exact.scaleb(-6)
        assert entry.price_source == "config"
        day = entry.created_at.date()
        await rollup_day(services.ledger, day)
        report = await verify_ledger(services.ledger, start=day, end=day, today=day)
        assert report.ok, report.differences
        r = await client.get("/v1/reports/costs?group_by=price_source", headers=auth("finance"))
        (row,) = r.json()["rows"]
        assert row["price_source"] == "config"
        assert Decimal(row["cost_usd"]) == exact.scaleb(-6)
        assert row["cost_usd"] != "0.000000"


async def test_every_row_names_its_price_source_in_show_csv_and_the_api(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    """Under GPU pricing the row names the rate it was priced at (id, basis, window)."""

    def gpu(config: dict[str, Any]) -> None:
        (dep,) = config["deployments"]
        dep["gpu_hourly_usd"] = "1.20"
        dep["gpu_expected_tokens_per_s"] = 400

    async with inprocess_gateway(redis_url, key_prefix, tmp_path, edit=gpu) as (
        services,
        _,
        client,
    ):
        entry = await booked(services, await tiny(client))
        rate = services.prices.gpu_rate(SMALL, entry.created_at.timestamp())
        assert rate is not None
        assert entry.price_source == rate.source
        assert entry.price_source.startswith(f"gpu-rate {SMALL}@")
        assert "(planned; window " in entry.price_source
        per_token = Decimal("1.20") / (Decimal(3600) * 400)
        exact = per_token * (entry.prompt_tokens + entry.completion_tokens)
        assert entry.cost_nano_usd == round(exact * 10**9)
        r = await client.get(
            "/v1/reports/costs?group_by=price_source&format=csv", headers=auth("acme")
        )
        (line,) = [row for row in csv.DictReader(io.StringIO(r.text)) if row["line"] == "usage"]
        assert line["price_source"] == rate.source
        shown = json.loads(encode_entry(entry))
        assert shown["price_source"] == rate.source and shown["cost_nano_usd"] > 0
        db = services.settings.database.url
    env = {"TIERGATE_DATABASE__URL": db, "TIERGATE_REDIS__URL": redis_url}
    config = str(tmp_path / "config.yaml")
    out = await asyncio.to_thread(  # the CLI runs its own event loop
        CliRunner().invoke,
        app,
        ["ledger", "show", "--config", config, "--request-id", entry.request_id],
        env=env,
    )
    assert out.exit_code == 0, out.output
    row = json.loads(out.output)
    assert row["price_source"] == rate.source
    # every column, defaults included: finance reads one row whole (a chat row's endpoint)
    assert set(row) == {f.name for f in dataclasses.fields(LedgerEntry)}
    assert (row["endpoint"], row["provisional"], row["superseded_at"]) == ("chat", False, None)
