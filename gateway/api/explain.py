"""``POST /v1/route/explain``: the plan the router would make for a chat request, without
calling a model, queueing anything or writing the ledger. The request's whole timeout (its
header, else the default; for a non-streamed one at most the OpenAI SDK's read timeout less a
margin, ``gateway.api.timeout``) is its time left, as for a request that has just arrived.
``worst_case_usd`` is what a budget would reserve for it (``worst_case_micro``: the prompt's
byte bound and the output limit on the dearest deployment of the plan)."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from gateway.accounting.bounds import prompt_token_bound
from gateway.accounting.budgets import worst_case_micro
from gateway.accounting.records import MICRO
from gateway.api.access import ADMIN, RULES, TENANT, access
from gateway.api.admission import Admitted, admit, read_body
from gateway.api.deps import ServicesDep
from gateway.api.edge import route
from gateway.api.error_docs import refusals
from gateway.api.timeout import request_timeout_ms
from gateway.auth.principals import Principal
from gateway.errors import InvalidRequest, ModelNotFound, PermissionDenied
from gateway.parts import Services
from router.rules import RuleSet

__all__ = ["explain_answer", "explained_tenant", "router"]

router = APIRouter(responses=refusals(400, 404, 413))


def explained_tenant(services: Services, principal: Principal, tenant: str | None) -> str:
    """Whose rules: a tenant or rules key explains its own tenant; admin names one."""
    own = principal.tenant
    if tenant is None:
        if own is None:
            raise InvalidRequest("name the tenant: ?tenant=<name>", param="tenant")
        tenant = own
    if not principal.is_admin and tenant != own:
        raise PermissionDenied(f"principal {principal.name!r} may not explain tenant {tenant!r}")
    if tenant not in services.policies:
        raise ModelNotFound(f"unknown tenant {tenant!r}", code="not_found", param="tenant")
    return tenant


@router.post("/v1/route/explain")
async def explain(
    request: Request,
    services: ServicesDep,
    principal: Annotated[Principal, access(TENANT, RULES, ADMIN)],
    tenant: Annotated[str | None, Query()] = None,
) -> dict[str, Any]:
    name = explained_tenant(services, principal, tenant)
    raw = await read_body(request, services.settings.limits.max_body_bytes)
    admitted = admit(raw, dict(request.headers), services.settings.limits)
    return await explain_answer(services, name, admitted, request.headers)


async def explain_answer(
    services: Services,
    name: str,
    admitted: Admitted,
    headers: Mapping[str, str],
    *,
    rules: RuleSet | None = None,
) -> dict[str, Any]:
    """The plan for ``admitted`` as explain shows it. ``rules``: plan under these (a draft,
    already followed by the global rules) instead of the tenant's running rules — the same
    inputs, signals and planner otherwise (the rules console's playground)."""
    timeout_ms = request_timeout_ms(
        admitted.meta,
        services.settings.queue,
        headers=headers,
        stream=admitted.request.stream,
    )
    routed = await route(services, name, admitted, time_left_s=timeout_ms / 1000, rules=rules)
    plan, inputs, signals = routed.plan, routed.inputs, routed.signals
    version: int | str = inputs.version if rules is None else "draft"
    body = plan.to_dict()
    body["skipped_rules"] = [{"rule": rid, "why": why} for rid, why in plan.skipped_rules]
    waits = {tier.value: round(wait, 3) for tier, wait in signals.expected_wait_s.items()}
    jobs = {tier.value: round(job_s, 3) for tier, job_s in signals.service_s.items()}
    prompt_tokens = admitted.features.estimated_prompt_tokens
    caps = [m for m in (admitted.request.output_limit, plan.max_tokens) if m is not None]
    await services.prices.ensure_rates()  # a GPU pool: this period's rate, as reserve_job
    worst = worst_case_micro(  # what BudgetBook.reserve_job would hold for it
        services.prices,
        plan.deployments,
        prompt_token_bound(admitted.body),
        min(caps) if caps else None,
        choices=admitted.choices,
    )
    return {
        "object": "route.plan",
        "tenant": name,
        **body,
        "rules_version": version,
        "conversation": {
            "key": inputs.context.conversation,
            "sticky_tier": None
            if inputs.context.sticky_tier is None
            else inputs.context.sticky_tier.value,
        },
        "estimated_prompt_tokens": prompt_tokens,
        "worst_case_usd": f"{(Decimal(worst) * MICRO).quantize(MICRO):f}",
        "timeout_ms": timeout_ms,
        "signals": {  # the live state the plan was made on
            "expected_wait_s": dict(sorted(waits.items())),
            "service_s": dict(sorted(jobs.items())),
            "unavailable": sorted(signals.unavailable),
        },
    }
