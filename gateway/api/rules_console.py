"""What the rules console (``/dashboard/rules``) reads besides ``/v1/rules``: per-rule figures from
the ledger, explain under the active rules and a draft side by side, and what-if for a draft.

- ``GET /v1/rules/{tenant}/figures?from=&to=``: the tenant's rules in order, then the global
  ones, each with the requests it decided, the share sent large, cost, baseline and saving
  (``gateway.accounting.rule_figures``), then the other deciders seen in the ledger.
- ``POST /v1/rules/{tenant}/explain``: ``{"request": <chat body>, "headers": {...},
  "draft": <rule file>|null}`` → the plan under the running rules and, with a draft, under it
  (``gateway.api.explain.explain_answer``: the same inputs, live signals and planner).
- ``POST /v1/rules/{tenant}/what-if?days=N``: body = the draft rule file → the tenant's last
  ``N`` days of ledger rows replayed under the running rules and the draft
  (``gateway.rules.replay``), with the rows that cannot be replayed and why.

All three only read: whoever may read the tenant's rules may call them (its tenant and rules
keys, finance, admin). A draft is validated as ``PUT`` would (400 ``invalid_rules``, line and
field) and never stored.
"""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from gateway.accounting.records import MICRO
from gateway.accounting.reports import CostSums
from gateway.accounting.rule_figures import RuleFigures, rule_figures
from gateway.api.admission import admit, read_body
from gateway.api.deps import ServicesDep
from gateway.api.error_docs import refusals
from gateway.api.explain import explain_answer
from gateway.api.period import PeriodDep
from gateway.api.routing import own_score_signals
from gateway.api.rules import (
    Reader,
    TenantName,
    can_write,
    invalid_rules,
    readable_tenant,
)
from gateway.api.rules import runtime as rules_runtime
from gateway.errors import GatewayError, InvalidRequest
from gateway.parts import Services
from gateway.rules.replay import Prediction, ledger_calls, replay
from gateway.rules.store import GLOBAL
from router.rules import MAX_RULE_BYTES, RuleSet, RulesInvalid

__all__ = ["router"]

router = APIRouter(prefix="/v1/rules", tags=["rules"], responses=refusals(400, 404))
MAX_DAYS = 90


def _usd(micro: int) -> str:
    return f"{(Decimal(micro) * MICRO).quantize(MICRO):f}"


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 6) if whole else None


def _sums(sums: CostSums, large: int) -> dict[str, Any]:
    return {
        "requests": sums.requests,
        "large": large,
        "large_share": _share(large, sums.requests),
        "cost_usd": f"{sums.cost.quantize(MICRO):f}",
        "baseline_usd": f"{sums.baseline.quantize(MICRO):f}",
        "savings_usd": f"{sums.savings.quantize(MICRO):f}",
        "unknown_price": sums.unknown_price,
    }


def _figure(found: RuleFigures | None) -> dict[str, Any]:
    if found is None:
        return _sums(CostSums(), 0)
    return _sums(found.sums, found.large)


@router.get("/{tenant}/figures")
async def figures(
    services: ServicesDep,
    principal: Reader,
    tenant: TenantName,
    period: PeriodDep,
) -> dict[str, Any]:
    """Each rule's requests, share sent large, cost and saving over the period."""
    readable_tenant(services, principal, tenant)
    start, end = period.start, period.end
    registry = rules_runtime(services).registry
    found, totals = await rule_figures(services.ledger, tenant=tenant, start=start, end=end)
    rows: list[dict[str, Any]] = []
    listed: set[str] = set()
    order = registry.own(GLOBAL) if tenant == GLOBAL else registry.for_tenant(tenant)
    for rule in order.rules:
        label = f"rule:{rule.id}"
        first = label not in listed  # a global rule shadowed by a tenant rule of the same id
        listed.add(label)
        rows.append(
            {
                "rule": label,
                "id": rule.id,
                "scope": rule.scope,
                "line": rule.line,
                "description": rule.description,
                **_figure(found.get(label) if first else None),
            }
        )
    others = [
        {"rule": key, **_figure(value)}
        for key, value in sorted(found.items(), key=lambda kv: (kv[0] is None, kv[0] or ""))
        if key not in listed
    ]
    large = sum(f.large for f in found.values())
    return {
        "object": "rules.figures",
        "tenant": tenant,
        "from": None if start is None else start.isoformat(),
        "to": None if end is None else end.isoformat(),
        "can_write": can_write(principal, tenant),
        "rules_version": registry.version(tenant),
        "global_version": registry.version(GLOBAL),
        "rules": rows,
        "others": others,
        "totals": _sums(totals, large),
    }


async def _draft(services: Services, tenant: str, source: str) -> RuleSet:
    registry = rules_runtime(services).registry
    try:
        compiled = await registry.validate(source)
    except RulesInvalid as exc:
        raise invalid_rules(exc) from None
    return registry.with_draft(tenant, compiled)


class ExplainDraft(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request: dict[str, Any]
    """A chat-completions body."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Request metadata headers (``x-tiergate-app``, ``x-tiergate-tags``, …)."""
    draft: str | None = Field(default=None, max_length=MAX_RULE_BYTES)
    """A rule file to plan under beside the running rules."""


async def _explain_one(
    services: Services, tenant: str, body: ExplainDraft, rules: RuleSet | None
) -> dict[str, Any]:
    limits = services.settings.limits
    raw = json.dumps(body.request).encode()
    headers = {k.lower(): v for k, v in body.headers.items()}
    admitted = admit(raw, headers, limits)
    try:
        return await explain_answer(services, tenant, admitted, headers, rules=rules)
    except GatewayError as exc:  # the refusal the real request would get, shown in its place
        if exc.status >= 500:
            raise
        return {"object": "error", "status": exc.status, "code": exc.code, "message": exc.message}


@router.post("/{tenant}/explain")
async def explain_draft(
    request: Request, services: ServicesDep, principal: Reader, tenant: TenantName
) -> dict[str, Any]:
    """The plan under the running rules and under a draft, side by side."""
    readable_tenant(services, principal, tenant)
    if tenant == GLOBAL:
        raise InvalidRequest("explain for a tenant, not the global rules", param="tenant")
    raw = await read_body(request, services.settings.limits.max_body_bytes + MAX_RULE_BYTES)
    try:
        body = ExplainDraft.model_validate_json(raw)
    except ValueError as exc:
        raise InvalidRequest(f"expected {{request, headers?, draft?}}: {exc}") from None
    draft = None if body.draft is None else await _draft(services, tenant, body.draft)
    active = await _explain_one(services, tenant, body, None)
    return {
        "object": "route.comparison",
        "tenant": tenant,
        "active": active,
        "draft": None if draft is None else await _explain_one(services, tenant, body, draft),
    }


def _prediction(p: Prediction) -> dict[str, Any]:
    """A replay's figures as the ledger's are shown (``_sums``), with the rows refused and
    each rule's count."""
    by_rule = dict(sorted(p.by_rule.items()))
    return {**_sums(p.sums, p.large), "refused": p.refused, "by_rule": by_rule}


@router.post("/{tenant}/what-if")
async def what_if_draft(
    request: Request,
    services: ServicesDep,
    principal: Reader,
    tenant: TenantName,
    days: Annotated[int, Query(ge=1, le=MAX_DAYS)] = 7,
) -> dict[str, Any]:
    """The last ``days`` days of the tenant's ledger rows replayed under the draft (the body)."""
    readable_tenant(services, principal, tenant)
    if tenant == GLOBAL:
        raise InvalidRequest("what-if replays a tenant's rows, not the global rules")
    try:
        source = (await read_body(request, MAX_RULE_BYTES)).decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest("the rule file must be UTF-8 text", code="invalid_rules") from None
    draft = await _draft(services, tenant, source)
    registry = rules_runtime(services).registry
    calls, truncated = await ledger_calls(services.ledger, tenant, days=days)
    result = await asyncio.to_thread(
        replay,
        calls,
        truncated=truncated,
        tenant=tenant,
        active=registry.for_tenant(tenant),
        draft=draft,
        policy=services.policies[tenant],
        catalog=services.catalog,
        classifier=services.classifier,
        prices=services.prices,
        score_signals=own_score_signals(services, tenant),
    )
    return {
        "object": "rules.what_if",
        "tenant": tenant,
        "days": days,
        "rows": result.rows,
        "truncated": result.truncated,
        "replayed": result.replayed,
        "booked": _prediction(result.booked),
        "active": _prediction(result.active),
        "draft": _prediction(result.draft),
        "not_replayable": [
            {"rules": u.which, "rule": u.rule, "conditions": list(u.conditions), "rows": u.rows}
            for u in result.unreplayable
        ],
        "approximate": [{"rule": r, "condition": c} for r, c in result.approximate],
    }
