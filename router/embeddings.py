"""The plan of an embeddings request: pure, over the embedding deployments alone.

Vectors of two embedding models are not comparable, so there is no classifier, no tier
choice and no fallback to another model: ``model`` names one embedding deployment (its id, or
an alias — the tenant's first, then the global ones — whose target is one), and the plan is that
deployment alone. ``auto`` takes the first embedding deployment the tenant may use. The tenant's
``allowed_tiers`` and ``allowed_models`` hold as for chat. Chat deployments are never chosen.
"""

from __future__ import annotations

from router.catalog import Catalog, DeploymentSpec, Signals, TenantPolicy
from router.errors import ModelNotAllowed, UnknownModel
from router.plan import RoutePlan

__all__ = ["plan_embedding"]


def _allowed(policy: TenantPolicy, spec: DeploymentSpec) -> bool:
    return spec.tier in policy.allowed_tiers and (
        policy.allowed_models is None or spec.model in policy.allowed_models
    )


def plan_embedding(
    requested_model: str,
    policy: TenantPolicy,
    embeddings: Catalog,
    signals: Signals | None = None,
) -> RoutePlan:
    """``embeddings``: the embedding deployments (and the global aliases)."""
    alias = None
    if requested_model == "auto":
        spec = next((s for s in embeddings.deployments if _allowed(policy, s)), None)
        if spec is None:
            raise ModelNotAllowed(f"tenant {policy.tenant!r} may use no embedding model")
        rule, reason = "auto:embedding", f"the tenant's first embedding model, {spec.model}"
    else:
        spec = embeddings.get(requested_model)
        if spec is None:
            found = policy.aliases.then(embeddings.aliases).resolve(requested_model)
            spec = embeddings.get(found.target) if found is not None else None
            if spec is None or found is None:
                raise UnknownModel(
                    f"{requested_model!r} is not an embedding model here (embedding models: "
                    f"{', '.join(s.model for s in embeddings.deployments) or 'none'})"
                )
            alias = f"{found.pattern} → {found.target}"
        if not _allowed(policy, spec):
            raise ModelNotAllowed(f"tenant {policy.tenant!r} may not use {spec.model!r}")
        rule, reason = "pin:model", f"embedding model {spec.model} requested"
    if signals is not None and spec.model in signals.unavailable:
        reason += " (currently unavailable)"
    return RoutePlan(
        tier=spec.tier,
        deployments=(spec.model,),
        rule=rule,
        reason=reason,
        requested_model=requested_model,
        alias=alias,
    )
