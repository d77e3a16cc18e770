"""The rules console's rig: the app over real services (Redis with a test prefix, SQLite in tmp)
with the example config's tenants, a ``rules:acme`` and a ``rules:globex`` key beside the
tenant, finance and admin keys, and a ledger of known rows decided by known rules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gateway.accounting.records import LedgerEntry
from gateway.settings import Settings
from tests.gateway.accounting.apps import KEYS, app_settings
from tests.gateway.accounting.factories import make_entry

CONSOLE_KEYS = {**KEYS, "rules-acme": "dev-rules-acme", "rules-globex": "dev-rules-globex"}
PRINCIPALS: list[dict[str, Any]] = [
    {"name": "admin", "roles": ["admin"], "key_env": "TG_T_ADMIN", "dev_key": "dev-admin"},
    {"name": "finance", "roles": ["finance"], "key_env": "TG_T_FIN", "dev_key": "dev-finance"},
    {
        "name": "rules-acme",
        "roles": ["rules:acme"],
        "key_env": "TG_T_RULES_ACME",
        "dev_key": "dev-rules-acme",
    },
    {
        "name": "rules-globex",
        "roles": ["rules:globex"],
        "key_env": "TG_T_RULES_GLOBEX",
        "dev_key": "dev-rules-globex",
    },
]

ACME_RULES = """\
rules:
  - id: billing-large
    description: billing answers need the large model
    when: {app: billing}
    then: {tier: large}
  - id: pii-on-prem
    when: {tag: pii}
    then: {forbid_external: true}
"""
GLOBAL_RULES = """\
rules:
  - id: batch-small
    when: {tag: batch}
    then: {tier: small}
"""


def console_settings(redis_url: str, prefix: str, tmp: Path) -> Settings:
    return app_settings(redis_url, prefix, tmp, principals=PRINCIPALS)


def auth(who: str) -> dict[str, str]:
    return {"authorization": f"Bearer {CONSOLE_KEYS[who]}"}


def ledger_rows(now: datetime | None = None) -> list[LedgerEntry]:
    """Acme's last two days: billing traffic sent large by ``billing-large``, pii traffic kept
    small, batch traffic by the global rule, threshold decisions; and a globex row."""
    now = now or datetime.now(UTC)
    large = "llama-3.1-70b-instruct-awq"
    rows: list[LedgerEntry] = []

    def add(n: int, **kw: Any) -> None:
        for _ in range(n):
            i = len(rows)
            created = now - timedelta(hours=1 + i % 40)
            rows.append(make_entry(f"c{i}", created_at=created, **kw))

    add(
        4, app="billing", rule="rule:billing-large", tier="large", deployment=large, score=0.2,
        cost_micro_usd=900, baseline_micro_usd=900,
    )  # fmt: skip
    add(3, tags=("pii",), rule="rule:pii-on-prem", score=0.1, cost_micro_usd=50)
    add(2, tags=("batch",), rule="rule:batch-small", score=0.9, cost_micro_usd=40)
    add(
        5, rule="auto:threshold", score=0.8, tier="large", deployment=large,
        cost_micro_usd=700, baseline_micro_usd=700,
    )  # fmt: skip
    add(6, rule="auto:threshold", score=0.05, cost_micro_usd=30)
    add(1, rule=None, tier=None, deployment=None, outcome="rate_limited", status_code=429,
        cost_micro_usd=0, baseline_micro_usd=0)  # fmt: skip
    add(2, tenant="globex", principal="tenant:globex", rule="auto:threshold", score=0.3)
    return rows
