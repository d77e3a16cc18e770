"""The edge's call into the (pure) router, and the translation of its refusals."""

from __future__ import annotations

from dataclasses import replace

from gateway.api.admission import Admitted
from gateway.api.meta import RequestMeta
from gateway.auth.directory import tenant_priority
from gateway.errors import (
    ContextTooLong,
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    PermissionDenied,
    UnsupportedCapability,
)
from gateway.parts import Services
from gateway.queue.lanes import lane_of
from gateway.rules.edge import RuleInputs
from router.catalog import Signals
from router.errors import (
    MissingCapability,
    ModelNotAllowed,
    NoDeploymentFits,
    RoutingError,
    UnknownModel,
)
from router.plan import RoutePlan
from router.planner import decide

__all__ = [
    "live_signals",
    "own_score_signals",
    "plan_request",
    "request_lane",
    "request_priority",
    "request_priority_of",
    "routing_error",
]


def routing_error(exc: RoutingError) -> GatewayError:
    if isinstance(exc, UnknownModel):
        return ModelNotFound(exc.message, param="model")
    if isinstance(exc, ModelNotAllowed):
        return PermissionDenied(exc.message, code="model_not_allowed", param="model")
    if isinstance(exc, NoDeploymentFits):
        return ContextTooLong(exc.message, param="messages")
    if isinstance(exc, MissingCapability):
        return UnsupportedCapability(exc.message, param=exc.param)
    return GatewayError(exc.message)


def request_priority(services: Services, tenant: str, admitted: Admitted) -> str:
    """The request's priority unless a rule sets one: its own ``x-tiergate-priority``, else its
    tenant's default."""
    return request_priority_of(services, tenant, admitted.meta)


def request_priority_of(services: Services, tenant: str, meta: RequestMeta) -> str:
    """``request_priority`` from the request's metadata."""
    return meta.priority or tenant_priority(services.settings, services.policies, tenant)


def request_lane(services: Services, tenant: str, admitted: Admitted) -> str:
    """The lane the request's job waits in unless a rule sets its priority."""
    return lane_of(request_priority(services, tenant, admitted))


def live_signals(services: Services, tenant: str, lane: str) -> Signals:
    """The live state the planner reads: a cached snapshot, never a Redis call per request.

    Each tier's expected wait is when a new job of ``tenant`` in ``lane`` would start there:
    behind the higher lanes and its fair share of its own, as deadline admission reckons
    (``TierView.start_in``), so a backlog of batch work, or of another tenant's, does not spill
    a request that would start at once."""
    snapshot = services.queue_snapshot
    watch = services.breaker_watch  # open circuit breakers (gateway.faults.watch)
    unavailable = watch.open_now if watch is not None else frozenset()
    own = replace(own_score_signals(services, tenant), unavailable=unavailable)
    return replace(
        own,
        expected_wait_s=snapshot.start_waits(lane, tenant, services.dispatcher.weight(tenant)),
        service_s=snapshot.service_times(),
    )


def own_score_signals(services: Services, tenant: str) -> Signals:
    """Signals holding only ``tenant``'s recent-score table (``gateway.rules.score_mix``)."""
    mix = services.score_mix
    return Signals(own_scores=mix.of(tenant), min_own_scores=mix.settings.min_scores)


def plan_request(
    services: Services,
    tenant: str,
    admitted: Admitted,
    inputs: RuleInputs | None = None,
    *,
    signals: Signals | None = None,
) -> RoutePlan:
    """``inputs``: the tenant's rules and the request's context (``gateway.rules.rule_inputs``);
    ``signals``: the live state to decide on (default: ``live_signals`` now, for the request's
    tenant and lane)."""
    if signals is None:
        signals = live_signals(services, tenant, request_lane(services, tenant, admitted))
    try:
        plan = decide(
            requested_model=admitted.request.model,
            features=admitted.features,
            max_tokens=admitted.max_tokens,
            policy=services.policies[tenant],
            catalog=services.catalog,
            signals=signals,
            classifier=services.classifier,
            rules=None if inputs is None else inputs.rules,
            context=None if inputs is None else inputs.context,
            needs=admitted.needs,
            hints=admitted.hints,
            quiet=admitted.quiet_hints,
        )
    except RoutingError as exc:
        raise routing_error(exc) from None
    if admitted.request.stream and admitted.choices > 1:
        return _without_litellm(services, plan)
    return plan


def _without_litellm(services: Services, plan: RoutePlan) -> RoutePlan:
    """A stream of ``n > 1`` choices skips litellm deployments: litellm's stream wrapper ends
    only the first choice (the others lose their ``finish_reason``). With none left, 400."""
    kept = tuple(
        d for d in plan.deployments if (spec := services.catalog.get(d)) and not spec.external
    )
    if kept == plan.deployments:
        return plan
    if not kept:
        raise InvalidRequest(
            "a stream with n > 1 cannot be served by an external (litellm) deployment; "
            "ask for n=1, or without stream",
            param="n",
        )
    dropped = ", ".join(d for d in plan.deployments if d not in kept)
    tier = services.catalog.get(kept[0])
    return replace(
        plan,
        deployments=kept,
        tier=tier.tier if tier is not None else plan.tier,
        reason=f"{plan.reason}; stream with n > 1: not {dropped} (litellm)",
    )
