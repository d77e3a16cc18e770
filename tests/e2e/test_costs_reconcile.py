"""Reconciliation through the real gateway (slow): 2,400 requests across the three example
tenants, streamed and not, a fifth of the large tier's calls failing (503) and falling back, with
explicit per-token prices. The report's total equals Σ(tokens x price) computed independently
from the simulators' usage logs and the config's prices, to the cent; each request is booked
exactly once; no streamed answer is booked at $0; ``tiergate ledger verify`` finds nothing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.accounting import SqlLedger, cost_report
from gateway.accounting.records import to_micro
from gateway.accounting.rollups import rollup_day
from gateway.accounting.verify import verify_ledger
from tests.support import TEST_KEYS, Stack

pytestmark = pytest.mark.slow

PROFILES = ("llama-3.1-8b-instruct", "llama-3.1-70b-instruct-awq", "gpt-4o-mini")
PER_MTOK = {  # (input, output) USD per million tokens, as written into the config below
    "llama-3.1-8b-instruct": (Decimal("0.03"), Decimal("0.06")),
    "llama-3.1-70b-instruct-awq": (Decimal("0.35"), Decimal("0.70")),
    "gpt-4o-mini": (Decimal("0.15"), Decimal("0.60")),
}
TENANTS = ("acme", "globex", "initech")
REQUESTS = 2400
CONCURRENCY = 24


def with_prices(config: dict[str, Any]) -> None:
    for dep in config["deployments"]:
        i, o = PER_MTOK[dep["model"]]
        dep["price"] = {"input_per_mtok": str(i), "output_per_mtok": str(o)}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("reconcile")
    with Stack.run(workdir, redis_url, PROFILES, edit=with_prices) as running:
        yield running


def _model(i: int, tenant: str) -> str:
    choices = ["auto", "small", "large", "external"]
    model = choices[i % 4]
    return "large" if tenant == "initech" and model == "external" else model


async def _one(client: openai.AsyncOpenAI, i: int, tenant: str) -> tuple[str, bool]:
    stream = i % 2 == 1
    words = " ".join(["tokens"] * (5 + (i * 7) % 120))
    kwargs = {
        "model": _model(i, tenant),
        "messages": [{"role": "user", "content": f"Request {i}: explain {words}"}],
        "max_tokens": 16 + i % 48,
    }
    if stream:
        raw = await client.chat.completions.with_raw_response.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
        async for _chunk in raw.parse():
            pass
    else:
        raw = await client.chat.completions.with_raw_response.create(**kwargs)
        raw.parse()
    return raw.headers["x-request-id"], stream


def _expected_micro(usage_logs: dict[str, Path]) -> tuple[Decimal, dict[str, int]]:
    """Σ tokens x price over every answered call in the simulators' logs (independent of the
    gateway's price code), and the per-request cost each implies (µ$, rounded like the ledger)."""
    total = Decimal(0)
    per_request: dict[str, Decimal] = {}
    for model, path in usage_logs.items():
        i, o = PER_MTOK[model]
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec["status"] != 200:
                continue
            cost = (i * rec["prompt_tokens"] + o * rec["completion_tokens"]).scaleb(-6)
            total += cost
            per_request[rec["request_id"]] = per_request.get(rec["request_id"], Decimal(0)) + cost
    return total, {rid: to_micro(c) for rid, c in per_request.items()}


@pytest.mark.timeout(600)
async def test_report_equals_usage_logs_to_the_cent(stack: Stack) -> None:
    async with httpx.AsyncClient() as admin:  # a fifth of the 70B's calls fail: fall back
        r = await admin.post(
            f"{stack.sim_url('llama-3.1-70b-instruct-awq')}/admin/faults",
            json={"error_status": 503, "error_rate": 0.2},
        )
        assert r.status_code == 200, r.text
    clients = {
        t: openai.AsyncOpenAI(
            base_url=f"{stack.base_url}/v1", api_key=TEST_KEYS[f"TIERGATE_KEY_{t.upper()}"],
            max_retries=0, timeout=120,
        )
        for t in TENANTS
    }  # fmt: skip
    gate = asyncio.Semaphore(CONCURRENCY)

    async def run(i: int) -> tuple[str, bool]:
        async with gate:
            tenant = TENANTS[i % 3]
            return await _one(clients[tenant], i, tenant)

    results = await asyncio.gather(*(run(i) for i in range(REQUESTS)))
    for c in clients.values():
        await c.close()
    ids = [rid for rid, _ in results]
    assert len(set(ids)) == REQUESTS

    ledger = await SqlLedger.connect(stack.database_url)
    try:
        for _ in range(600):  # the sink books asynchronously
            report = await cost_report(ledger, tenant=None, start=None, end=None, group_by=())
            if report.totals.requests >= REQUESTS:
                break
            await asyncio.sleep(0.1)
        totals = report.totals
        assert totals.requests == REQUESTS  # each request exactly once
        assert totals.unknown_price == 0
        rows = {rid: await ledger.get(rid) for rid in ids}
        assert all(row is not None and row.outcome == "ok" for row in rows.values())
        streamed = [rows[rid] for rid, s in results if s]
        assert streamed and all((row.cost_micro_usd or 0) > 0 for row in streamed if row)
        fell_back = [r for r in rows.values() if r and len(r.attempts) > 1]
        assert fell_back, "no request fell back; the fault did not bite"

        expected, per_request = _expected_micro(stack.usage_logs)
        booked = totals.cost
        assert booked.quantize(Decimal("0.01")) == expected.quantize(Decimal("0.01"))
        assert abs(booked - expected) <= Decimal("0.0000005") * REQUESTS  # µ$ rounding only
        mismatched = {
            rid: (row.cost_micro_usd, per_request.get(rid))
            for rid, row in rows.items()
            if row is not None and row.cost_micro_usd != per_request.get(rid)
        }
        assert mismatched == {}

        for day in {row.created_at.date() for row in rows.values() if row}:
            await rollup_day(ledger, day)
        check = await verify_ledger(ledger)
        assert check.ok, check.differences
    finally:
        await ledger.aclose()
    print(
        f"reconciled {REQUESTS} requests ({len(fell_back)} fell back): booked ${booked}, "
        f"usage logs ${expected}"
    )
