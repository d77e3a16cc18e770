"""Each tenant's recent scores from the real ledger (SQLite and PostgreSQL) hold
``target_large_share`` on its own traffic; a tenant with too few falls back to the mix."""

from __future__ import annotations

import asyncio
import gzip
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gateway.accounting import SqlLedger
from gateway.rules.score_mix import ScoreMix
from gateway.settings import OwnShareSettings
from router.catalog import Catalog, DeploymentSpec, Signals, TenantPolicy, Tier
from router.features import PromptFeatures
from router.loader import load_serving_classifier
from router.planner import decide
from router.rules import parse_rules
from router.share import ShareCurve
from tests.gateway.accounting.factories import make_entry
from tests.inprocess import inprocess_gateway

EXAMS = Path(__file__).parents[3] / "data" / "routing" / "mmlu_pro_llama31_train.jsonl.gz"
NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
CATALOG = Catalog(
    (DeploymentSpec("small-a", Tier.SMALL, 32_768), DeploymentSpec("large-a", Tier.LARGE, 32_768))
)
RULES = parse_rules(
    "rules:\n  - id: share\n    when: {}\n    then: {target_large_share: 0.3}\n", catalog=CATALOG
)


def exam_prompts(n: int) -> list[str]:
    with gzip.open(EXAMS, "rt", encoding="utf-8") as f:
        return [json.loads(line)["prompt"] for _, line in zip(range(n), f, strict=False)]


async def test_target_share_holds_on_the_tenants_own_traffic(store_url: str) -> None:
    classifier = load_serving_classifier()
    prompts = exam_prompts(800)
    features = [PromptFeatures.from_messages([{"role": "user", "content": p}]) for p in prompts]
    scores = [classifier.score(f) for f in features]
    ledger = await SqlLedger.connect(store_url)
    try:
        minutes = [NOW - timedelta(minutes=800 - i) for i in range(800)]  # newest last
        await ledger.record_many(
            [  # the exam tenant's last 800 requests, one a minute
                make_entry(f"e{i}", tenant="exams", score=s, created_at=minutes[i])
                for i, s in enumerate(scores)
            ]
            + [  # older than the window, unscored, or another tenant's: not read
                make_entry(f"old{i}", tenant="exams", score=0.0, created_at=NOW - timedelta(days=8))
                for i in range(100)
            ]
            + [make_entry(f"no{i}", tenant="exams", score=None, created_at=NOW) for i in range(20)]
            + [make_entry(f"new{i}", tenant="fresh", score=0.9, created_at=NOW) for i in range(50)]
        )
        mix = ScoreMix(ledger.engine, lambda: ["exams", "fresh", "nobody"])
        await mix.refresh(NOW)
        own = mix.of("exams")
        assert own is not None and own.count == 800 and own.window_days == 7
        assert mix.of("nobody") is None

        def plan_all(tenant: str) -> list[Tier]:
            signals = Signals(own_scores=mix.of(tenant), min_own_scores=mix.settings.min_scores)
            policy = TenantPolicy(tenant, threshold=0.5)
            return [
                decide(requested_model="auto", features=f, max_tokens=64, policy=policy,
                       catalog=CATALOG, signals=signals, classifier=classifier, rules=RULES).tier
                for f in features
            ]  # fmt: skip

        large = plan_all("exams").count(Tier.LARGE) / len(prompts)
        assert abs(large - 0.3) <= 0.03, large
        # the documented mix's threshold sends far more of this tenant's traffic large
        on_mix = sum(s >= classifier.threshold_for_share(0.3) for s in scores) / len(scores)
        assert on_mix > 0.5, on_mix

        signals = Signals(own_scores=mix.of("fresh"), min_own_scores=mix.settings.min_scores)
        fresh = decide(requested_model="auto", features=features[0], max_tokens=64,
                       policy=TenantPolicy("fresh"), catalog=CATALOG, signals=signals,
                       classifier=classifier, rules=RULES)  # fmt: skip
        assert fresh.share_source is not None and fresh.share_source.curve is ShareCurve.MIX
        assert fresh.share_source.scores == 50
        assert fresh.threshold == classifier.threshold_for_share(0.3)

        newest = ScoreMix(ledger.engine, lambda: ["exams"], OwnShareSettings(max_scores=100))
        await newest.refresh(NOW)
        table = newest.of("exams")
        assert table is not None and table.count == 100
        assert (table.points[0], table.points[-1]) == (min(scores[-100:]), max(scores[-100:]))
    finally:
        await ledger.aclose()


ADMIN = {"authorization": "Bearer dev-admin"}
SHARE_RULES = "rules:\n  - id: share\n    when: {}\n    then: {target_large_share: 0.3}\n"


async def test_explain_says_which_curve_set_the_threshold(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    """Through a running gateway: acme has 300 scored requests in its ledger and gets its own
    curve, globex none and gets the documented mix; explain's ``share_source`` and reason say so."""
    async with inprocess_gateway(redis_url, key_prefix, tmp_path) as (services, _, client):
        assert services.score_mix is not None and services.classifier is not None
        for tenant in ("acme", "globex"):
            put = await client.put(f"/v1/rules/{tenant}", content=SHARE_RULES, headers=ADMIN)
            assert put.status_code == 200, put.text
        now = datetime.now(UTC)
        await services.ledger.record_many(
            [
                make_entry(f"a{i}", score=0.5 + i / 600, created_at=now - timedelta(seconds=i))
                for i in range(300)
            ]
        )
        await services.score_mix.refresh()

        async def explain(tenant: str) -> dict[str, Any]:
            for _ in range(100):
                reply = await client.post(
                    "/v1/route/explain",
                    json={"model": "auto", "messages": [{"role": "user", "content": "hi"}]},
                    headers={"authorization": f"Bearer dev-{tenant}"},
                )
                assert reply.status_code == 200, reply.text
                plan: dict[str, Any] = reply.json()
                if plan["rules_version"] == 1:
                    return plan
                await asyncio.sleep(0.05)
            raise AssertionError(f"{tenant}'s rules never loaded")

        own = await explain("acme")
        assert own["rule"] == "rule:share"
        assert own["share_source"] == {
            "share": 0.3, "curve": "tenant", "scores": 300, "window_days": 7.0, "min_scores": None,
        }  # fmt: skip
        assert own["threshold"] == pytest.approx(0.5 + 0.7 * 299 / 600, abs=1e-3)
        assert "the tenant's own last 300 scores (≤ 7 days)" in own["reason"]
        mix = await explain("globex")
        assert mix["share_source"]["curve"] == "mix" and mix["share_source"]["scores"] is None
        assert mix["threshold"] == services.classifier.threshold_for_share(0.3)  # type: ignore[attr-defined]
        assert "documented mix; the tenant has 0 scores, fewer than 200" in mix["reason"]
