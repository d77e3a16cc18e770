"""The rules console (``/dashboard/rules``) in a real headless Chromium, driven over the DevTools
protocol: typed into, clicked, and photographed — as a ``rules:acme`` key (edits), a tenant key
(reads its own only), finance (reads every tenant, edits nothing) and a key that reads no rules.

The gateway runs in-process under uvicorn over real Redis (test prefix) and SQLite (tmp); a
second set of services on the same Redis and database stands for a second gateway process.
Screenshots are saved in the test's tmp directory and checked by their pixels.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from PIL import Image

from gateway.app import create_app
from gateway.services import Services, open_services
from gateway.settings import Settings
from tests.browser.cdp import Page, browser
from tests.gateway.accounting.apps import running_app
from tests.gateway.rules.console_rig import (
    ACME_RULES,
    GLOBAL_RULES,
    auth,
    console_settings,
    ledger_rows,
)
from tests.support import free_port

pytestmark = pytest.mark.slow

DRAFT = ACME_RULES.replace("then: {tier: large}", "then: {tier: small}")
BROKEN = ACME_RULES.replace("then: {tier: large}", "then: {tier: huge}")
TEXT_RULE = """\
rules:
  - id: refunds
    when: {app: billing, last_message: {keywords: [refund]}}
    then: {tier: large}
"""
RED = (0xB0, 0x00, 0x20)  # rules.css: a line the validator names
ORANGE = (0xF2, 0x8E, 0x2B)  # rules.css: a draft plan that differs from the active one
AMBER = (0xFF, 0xF8, 0xE1)  # rules.css: the note on rows a what-if cannot replay


@dataclass
class Served:
    base: str
    services: Services
    client: httpx.AsyncClient
    settings: Settings


@pytest.fixture
async def served(redis_url: str, key_prefix: str, tmp_path: Path) -> AsyncIterator[Served]:
    settings = console_settings(redis_url, key_prefix, tmp_path)
    async with running_app(settings) as (services, client):
        await services.ledger.record_many(ledger_rows())
        for tenant, source, who in (
            ("acme", ACME_RULES, "rules-acme"),
            ("_global", GLOBAL_RULES, "admin"),
            ("globex", "rules:\n  - id: globex-secret-rule\n    then: {tier: small}\n", "admin"),
        ):
            put = await client.put(f"/v1/rules/{tenant}", content=source, headers=auth(who))
            assert put.status_code == 200, put.text
        app = create_app(services=services)
        app.state.services = services
        port = free_port()
        server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_level="warning")
        )
        task = asyncio.create_task(server.serve())
        for _ in range(200):  # up to 10 s
            if server.started:
                break
            await asyncio.sleep(0.05)
        assert server.started
        try:
            yield Served(f"http://127.0.0.1:{port}", services, client, settings)
        finally:
            server.should_exit = True
            await task


def count(image: Image.Image, color: tuple[int, int, int], tolerance: int = 24) -> int:
    """Pixels within ``tolerance`` of ``color`` on every channel."""
    pixels: Any = image.get_flattened_data()
    return sum(
        1
        for p in pixels
        if all(abs(int(a) - b) <= tolerance for a, b in zip(p, color, strict=True))
    )


def distinct_colors(image: Image.Image) -> int:
    return len(set(image.resize((200, 200)).get_flattened_data()))


async def open_console(page: Page, base: str, key: str, fragment: str = "") -> None:
    await page.goto(f"{base}/dashboard/rules#key={key}{fragment}")
    state = await page.wait_for("document.body.dataset.loaded")
    assert state == "true", await page.eval("document.getElementById('error').textContent")


async def visible(page: Page, element_id: str) -> bool:
    return bool(await page.eval(f"document.getElementById('{element_id}').checkVisibility()"))


async def figures_in_page(page: Page) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = await page.eval(
        "[...document.querySelectorAll('#rules-table tbody tr')].map(tr => ({...tr.dataset}))"
    )
    return rows


@pytest.mark.timeout(300)
async def test_a_rules_key_edits_tries_applies_and_rolls_back(
    served: Served, tmp_path: Path
) -> None:
    base, client = served.base, served.client
    async with browser(tmp_path / "chromium") as page:
        await open_console(page, base, "dev-rules-acme")
        for shown in ("apply-form", "diff-box", "whatif-section", "plan-draft"):
            assert await visible(page, shown), shown
        assert not await visible(page, "tenant-label")  # a tenant's key: its own tenant
        # 1. The rules in order, global after, with the API's figures (which equal ledger sums:
        # tests/gateway/rules/test_console_api.py).
        api = (await client.get("/v1/rules/acme/figures", headers=auth("rules-acme"))).json()
        shown = await figures_in_page(page)
        assert [(r["rule"], r["scope"]) for r in shown[:3]] == [
            ("billing-large", "tenant"), ("pii-on-prem", "tenant"), ("batch-small", "global"),
        ]  # fmt: skip
        for row, expected in zip(shown, api["rules"], strict=False):
            assert (row["requests"], row["cost"], row["savings"]) == (
                str(expected["requests"]), expected["cost_usd"], expected["savings_usd"],
            )  # fmt: skip
            share = expected["large_share"]
            assert (row["largeShare"] == "") == (share is None)
            assert share is None or float(row["largeShare"]) == share
        table = await page.screenshot(tmp_path / "rules-table.png", "#rules-table")
        assert table.width > 600 and distinct_colors(table) > 8
        assert "globex-secret-rule" not in await page.eval("document.body.innerText")

        # 2. A draft with an error shows it in place, at its line; Apply stays off.
        await page.type_into("#source", BROKEN)
        await page.wait_for("document.getElementById('editor-section').dataset.state === 'invalid'")
        message = await page.eval("document.getElementById('validation').textContent")
        assert message.startswith("line 5: rules[0].then.tier: "), message
        assert await page.eval("document.querySelector('#gutter .bad').dataset.line") == "5"
        assert await page.eval("document.getElementById('apply').disabled") is True
        editor = await page.screenshot(tmp_path / "draft-error.png", "#editor-section")
        assert count(editor, RED) > 200  # the gutter's line 5 and the message, in red

        # A valid draft: the diff against the active version, Apply on.
        await page.type_into("#source", DRAFT)
        await page.wait_for("document.getElementById('editor-section').dataset.state === 'changed'")
        diff = await page.eval("document.getElementById('diff').textContent")
        assert "-    then: {tier: large}" in diff and "+    then: {tier: small}" in diff
        await page.screenshot(tmp_path / "draft-diff.png", "#editor-section")

        # 3. The playground: the active rules and the draft side by side.
        await page.type_into("#play-app", "billing")
        await page.click("#play-form button[type=submit]")
        await page.wait_for("document.body.dataset.explained")
        active = await page.eval("({...document.getElementById('plan-active').dataset})")
        draft = await page.eval("({...document.getElementById('plan-draft').dataset})")
        assert (active["tier"], active["rule"]) == ("large", "rule:billing-large")
        assert (draft["tier"], draft["rule"]) == ("small", "rule:billing-large")
        fields = await page.eval(
            "[...document.querySelectorAll('#plan-draft dd')].map(d => d.dataset.field)"
        )
        for field in ("tier", "deployment", "rule", "score", "threshold", "fallback", "worst"):
            assert field in fields
        sides = await page.screenshot(tmp_path / "playground.png", ".sides")
        assert count(sides, ORANGE) > 100  # the draft's box is outlined: it differs

        # 4. What-if: the draft's predicted cost, against the API's replay of the same rows.
        await page.click("#whatif-form button[type=submit]")
        await page.wait_for("document.body.dataset.whatif")
        predicted = await page.eval(
            "document.querySelector('#whatif tr[data-metric=cost_usd]').dataset.draft"
        )
        replay = (
            await client.post(
                "/v1/rules/acme/what-if?days=7", content=DRAFT, headers=auth("rules-acme")
            )
        ).json()
        assert predicted == replay["draft"]["cost_usd"]
        assert replay["active"]["large"] - replay["draft"]["large"] == 4
        whatif = await page.screenshot(tmp_path / "what-if.png", "#whatif")
        assert whatif.height > 100 and distinct_colors(whatif) > 4
        assert not await page.eval("document.getElementById('not-replayable')")

        # A condition the ledger cannot replay is said, with the rows it leaves out.
        await page.type_into("#source", TEXT_RULE + DRAFT.removeprefix("rules:\n"))
        await page.wait_for("document.getElementById('editor-section').dataset.state === 'changed'")
        await page.eval("delete document.body.dataset.whatif")
        await page.click("#whatif-form button[type=submit]")
        await page.wait_for("document.body.dataset.whatif")
        said = await page.eval("document.getElementById('not-replayable').textContent")
        assert "4 requests reach draft rule refunds whose last_message cannot be checked" in said
        assert "16 of 20 routed requests" in await page.eval(
            "document.getElementById('whatif-summary').textContent"
        )
        warned = await page.screenshot(tmp_path / "what-if-unreplayable.png", "#not-replayable")
        assert count(warned, AMBER, tolerance=6) > warned.width * warned.height // 2
        await page.type_into("#source", DRAFT)
        await page.wait_for("document.getElementById('editor-section').dataset.state === 'changed'")

        # 5. Apply with an author: a second gateway reaches the new rules within a second.
        async with open_services(served.settings, dev=True, workers=False) as second:
            registry = second.rules
            assert registry is not None and registry.registry.version("acme") == 1
            await page.type_into("#author", "Ada")
            await page.click("#apply")
            applied = time.monotonic()
            await page.wait_for("document.getElementById('apply-status').dataset.version === '2'")
            while registry.registry.version("acme") != 2:
                assert time.monotonic() - applied < 1.0, "the second gateway did not reload"
                await asyncio.sleep(0.01)
            rules = registry.registry.for_tenant("acme").rules
            assert [r.id for r in rules][:1] == ["billing-large"] and rules[0].then.tier is not None
            assert rules[0].then.tier.value == "small"
        body = {"model": "auto", "messages": [{"role": "user", "content": "Invoice 7 total?"}]}
        billing = {**auth("acme"), "x-tiergate-app": "billing"}
        plan = (await client.post("/v1/route/explain", json=body, headers=billing)).json()
        assert plan["tier"] == "small"
        history = await page.eval("document.querySelector('#history tbody tr').innerText")
        assert "rules-acme (Ada)" in history

        # One-click rollback to version 1 restores the previous routing.
        await page.click("button[data-rollback='1']")
        await page.wait_for("document.getElementById('apply-status').dataset.version === '3'")
        plan = (await client.post("/v1/route/explain", json=body, headers=billing)).json()
        assert (plan["tier"], plan["rule"]) == ("large", "rule:billing-large")
        full = await page.screenshot(tmp_path / "console.png")
        assert full.height > 1000 and distinct_colors(full) > 16


@pytest.mark.timeout(240)
async def test_a_tenant_key_reads_its_own_rules_only(served: Served, tmp_path: Path) -> None:
    async with browser(tmp_path / "chromium") as page:
        await open_console(page, served.base, "dev-acme", "&tenant=globex")
        assert await page.eval("document.body.dataset.tenant") == "acme"
        text = await page.eval("document.body.innerText")
        assert "globex-secret-rule" not in text and "billing-large" in text
        assert await page.eval("document.getElementById('source').readOnly") is True
        for hidden in ("apply-form", "diff-box", "whatif-section", "plan-draft", "tenant-label"):
            assert not await visible(page, hidden), hidden
        assert await page.eval("document.querySelectorAll('[data-rollback]').length") == 0
        assert "read only" in await page.eval("document.getElementById('mode').textContent")
        # The playground still explains under the active rules.
        await page.type_into("#play-app", "billing")
        await page.click("#play-form button[type=submit]")
        await page.wait_for("document.body.dataset.explained")
        assert await page.eval("document.getElementById('plan-active').dataset.rule") == (
            "rule:billing-large"
        )
        shot = await page.screenshot(tmp_path / "tenant.png")
        assert count(shot, RED) == 0  # no error anywhere
        # Asked for another tenant directly, the API refuses, so the page has nothing to show.
        other = await served.client.get("/v1/rules/globex", headers=auth("acme"))
        assert other.status_code == 403


@pytest.mark.timeout(240)
async def test_finance_reads_every_tenant_and_edits_none(served: Served, tmp_path: Path) -> None:
    async with browser(tmp_path / "chromium") as page:
        await open_console(page, served.base, "dev-finance", "&tenant=globex")
        assert await page.eval("document.body.dataset.tenant") == "globex"
        shown = await figures_in_page(page)
        assert shown[0]["rule"] == "globex-secret-rule"
        assert await page.eval("document.getElementById('source').readOnly") is True
        for hidden in ("apply-form", "diff-box", "whatif-section", "plan-draft"):
            assert not await visible(page, hidden), hidden
        assert await visible(page, "tenant-label")  # finance picks the tenant
        assert await page.eval("document.querySelectorAll('[data-rollback]').length") == 0
        await page.screenshot(tmp_path / "finance.png")
    put = await served.client.put("/v1/rules/globex", content=DRAFT, headers=auth("finance"))
    assert put.status_code == 403


@pytest.mark.timeout(240)
async def test_a_key_that_reads_no_rules_is_refused(served: Served, tmp_path: Path) -> None:
    async with browser(tmp_path / "chromium") as page:
        await page.goto(f"{served.base}/dashboard/rules#key=not-a-key")
        await page.wait_for("document.getElementById('signin-error').textContent")
        assert await page.eval("document.getElementById('signin-error').textContent") == (
            "This key cannot read routing rules."
        )
        assert await page.eval("document.getElementById('app').hidden") is True
