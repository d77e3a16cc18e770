"""``POST /v1/route/explain``: the plan the router would make for a chat request, without
calling a model, queueing anything or writing the ledger. The request's whole timeout (its
header, else the default; for a non-streamed one at most the OpenAI SDK's read timeout less a
margin, ``gateway.api.timeout``) is its time left, as for a request that has just arrived."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from gateway.api.admission import admit, read_body
from gateway.api.deps import ServicesDep
from gateway.api.error_docs import refusals
from gateway.api.routing import live_signals, plan_request, request_lane
from gateway.api.timeout import request_timeout_ms
from gateway.auth.access import ADMIN, RULES, TENANT, access
from gateway.auth.principals import Principal
from gateway.errors import InvalidRequest, ModelNotFound, PermissionDenied
from gateway.rules.edge import rule_inputs
from gateway.services import Services

__all__ = ["explained_tenant", "router"]

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
    timeout_ms = request_timeout_ms(
        admitted.meta,
        services.settings.queue,
        headers=request.headers,
        stream=admitted.request.stream,
    )
    inputs = await rule_inputs(services.rules, name, admitted, time_left_s=timeout_ms / 1000)
    signals = live_signals(services, name, request_lane(services, name, admitted))
    plan = plan_request(services, name, admitted, inputs, signals=signals)
    body = plan.to_dict()
    body["skipped_rules"] = [{"rule": rid, "why": why} for rid, why in plan.skipped_rules]
    waits = {tier.value: round(wait, 3) for tier, wait in signals.expected_wait_s.items()}
    jobs = {tier.value: round(job_s, 3) for tier, job_s in signals.service_s.items()}
    return {
        "object": "route.plan",
        "tenant": name,
        **body,
        "rules_version": inputs.version,
        "conversation": {
            "key": inputs.context.conversation,
            "sticky_tier": None
            if inputs.context.sticky_tier is None
            else inputs.context.sticky_tier.value,
        },
        "estimated_prompt_tokens": admitted.features.estimated_prompt_tokens,
        "timeout_ms": timeout_ms,
        "signals": {  # the live state the plan was made on
            "expected_wait_s": dict(sorted(waits.items())),
            "service_s": dict(sorted(jobs.items())),
            "unavailable": sorted(signals.unavailable),
        },
    }
