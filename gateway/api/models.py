"""``GET /v1/models``: what this tenant may ask for: ``auto``, its tiers, its deployments (chat,
then embedding ones, for ``/v1/embeddings``), then
its exact model aliases whose target it may use (``owned_by: "tiergate-alias"``), so an SDK that
checks the model list finds the OpenAI name it was written for. Patterns (``gpt-4o*``) cannot
be listed."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter

from gateway.api.access import AUTHENTICATED, access
from gateway.api.deps import ServicesDep
from gateway.api.error_docs import refusals
from gateway.auth.principals import Principal
from gateway.errors import PermissionDenied
from router.catalog import Tier

__all__ = ["router"]

router = APIRouter(responses=refusals())


@router.get("/v1/models")
async def list_models(
    services: ServicesDep, principal: Annotated[Principal, access(AUTHENTICATED)]
) -> dict[str, Any]:
    tenant = principal.tenant
    if tenant is None or tenant not in services.policies:
        raise PermissionDenied(f"principal {principal.name!r} cannot call models")
    policy = services.policies[tenant]
    ids: list[tuple[str, str]] = [("auto", "tiergate")]
    ids += [(tier.value, "tiergate") for tier in Tier if tier in policy.allowed_tiers]
    for spec in (*services.catalog.deployments, *services.embeddings.deployments):
        allowed_model = policy.allowed_models is None or spec.model in policy.allowed_models
        if spec.tier in policy.allowed_tiers and allowed_model:
            ids.append((spec.model, spec.provider))
    usable = {i for i, _ in ids}
    rules = services.rules.registry.for_tenant(tenant).aliases
    aliases = rules.then(policy.aliases).then(services.catalog.aliases)
    ids += [(a.pattern, "tiergate-alias") for a in aliases.exact_names() if a.target in usable]
    return {
        "object": "list",
        "data": [{"id": i, "object": "model", "created": 0, "owned_by": o} for i, o in ids],
    }
