"""What the edge does around the (pure) planner for rules: read the inputs, apply the outputs.

Before: the tenant's compiled rules (memory), the request's metadata, time and time left to its
deadline, and the conversation's sticky tier (one Redis GET, only for a later turn). After: hold
a conversation that went large, and lower the body's ``max_tokens`` to a rule's cap.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from gateway.rules.registry import RuleRegistry
from gateway.rules.sticky import StickyConversations, conversation_key, later_turn
from router.catalog import Tier
from router.features import PromptFeatures
from router.plan import RoutePlan
from router.rules import RequestContext, RuleSet

__all__ = [
    "RuleInputs",
    "RuledRequest",
    "RulesRuntime",
    "capped_body",
    "hold_conversation",
    "rule_inputs",
]


class _Meta(Protocol):
    @property
    def app(self) -> str | None: ...
    @property
    def tags(self) -> tuple[str, ...]: ...
    @property
    def conversation_id(self) -> str | None: ...


class _Client(Protocol):
    @property
    def user(self) -> str | None: ...


class RuledRequest(Protocol):
    """What the rules read of an admitted request (``gateway.api.admission.Admitted``): its
    metadata, its messages, its turns and the client's ``user``."""

    @property
    def request(self) -> _Client: ...
    @property
    def body(self) -> dict[str, Any]: ...
    @property
    def meta(self) -> _Meta: ...
    @property
    def features(self) -> PromptFeatures: ...


@dataclass(frozen=True, slots=True)
class RulesRuntime:
    """The rules part of ``Services``: the registry (and through it the SQL store) and the
    sticky-conversation state."""

    registry: RuleRegistry
    sticky: StickyConversations


@dataclass(frozen=True, slots=True)
class RuleInputs:
    rules: RuleSet
    context: RequestContext
    version: int


async def rule_inputs(
    runtime: RulesRuntime,
    tenant: str,
    admitted: RuledRequest,
    *,
    now: datetime | None = None,
    time_left_s: float | None = None,
) -> RuleInputs:
    """``time_left_s``: from the request's deadline (``gateway.api.timeout``), for deadline
    spill-over; ``None``: none known (no deadline spill-over)."""
    meta = admitted.meta
    messages = admitted.body.get("messages") or []
    key = conversation_key(meta.conversation_id, messages)
    sticky: Tier | None = None
    if key is not None and later_turn(meta.conversation_id, admitted.features.n_turns):
        sticky = await runtime.sticky.tier(tenant, key)
    context = RequestContext(
        app=meta.app,
        tags=meta.tags,
        user=admitted.request.user,
        now=now or datetime.now(UTC),
        sticky_tier=sticky,
        conversation=key,
        time_left_s=time_left_s,
    )
    registry = runtime.registry
    return RuleInputs(registry.for_tenant(tenant), context, registry.version(tenant))


async def hold_conversation(
    runtime: RulesRuntime, tenant: str, inputs: RuleInputs, plan: RoutePlan
) -> None:
    key = inputs.context.conversation
    if key is not None and plan.tier is Tier.LARGE:
        await runtime.sticky.hold(tenant, key, Tier.LARGE)


def capped_body(body: dict[str, Any], plan: RoutePlan) -> dict[str, Any]:
    """The backend body with ``max_tokens`` lowered to the plan's cap (if a rule set one)."""
    cap = plan.max_tokens
    if cap is None:
        return body
    current = body.get("max_completion_tokens") or body.get("max_tokens")
    limit = cap if not isinstance(current, int) else min(cap, current)
    out = {k: v for k, v in body.items() if k != "max_completion_tokens"}
    out["max_tokens"] = limit
    return out
