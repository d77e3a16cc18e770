"""The edge's call into the (pure) router, and the translation of its refusals."""

from __future__ import annotations

from gateway.api.admission import Admitted
from gateway.auth.directory import tenant_priority
from gateway.errors import ContextTooLong, GatewayError, ModelNotFound, PermissionDenied
from gateway.queue.lanes import lane_of
from gateway.rules.edge import RuleInputs
from gateway.services import Services
from router.catalog import Signals
from router.errors import ModelNotAllowed, NoDeploymentFits, RoutingError, UnknownModel
from router.plan import RoutePlan
from router.planner import decide

__all__ = ["live_signals", "plan_request", "request_lane", "request_priority", "routing_error"]


def routing_error(exc: RoutingError) -> GatewayError:
    if isinstance(exc, UnknownModel):
        return ModelNotFound(exc.message, param="model")
    if isinstance(exc, ModelNotAllowed):
        return PermissionDenied(exc.message, code="model_not_allowed", param="model")
    if isinstance(exc, NoDeploymentFits):
        return ContextTooLong(exc.message, param="messages")
    return GatewayError(exc.message)


def request_priority(services: Services, tenant: str, admitted: Admitted) -> str:
    """The request's priority unless a rule sets one: its own ``x-tiergate-priority``, else its
    tenant's default."""
    return admitted.meta.priority or tenant_priority(services.settings, services.policies, tenant)


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
    if snapshot is None:
        return Signals(unavailable=unavailable)
    return Signals(
        unavailable=unavailable,
        expected_wait_s=snapshot.start_waits(lane, tenant, services.dispatcher.weight(tenant)),
        service_s=snapshot.service_times(),
    )


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
        return decide(
            requested_model=admitted.request.model,
            features=admitted.features,
            max_tokens=admitted.max_tokens,
            policy=services.policies[tenant],
            catalog=services.catalog,
            signals=signals,
            classifier=services.classifier,
            rules=None if inputs is None else inputs.rules,
            context=None if inputs is None else inputs.context,
        )
    except RoutingError as exc:
        raise routing_error(exc) from None
