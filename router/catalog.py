"""What the router decides over: tiers, deployments and tenant policies, as plain frozen data.

The gateway builds these from its settings at start-up; the router never reads config itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum

from router.aliases import ModelAliases
from router.capabilities import DEFAULT_CAPABILITIES, Capability
from router.share import ScoreQuantiles

__all__ = ["Catalog", "DeploymentSpec", "Signals", "TenantPolicy", "Tier"]


class Tier(StrEnum):
    SMALL = "small"
    LARGE = "large"
    EXTERNAL = "external"


@dataclass(frozen=True, slots=True)
class DeploymentSpec:
    """One model served one way. ``model`` is the id clients and backends use."""

    model: str
    tier: Tier
    max_model_len: int
    provider: str = "vllm"  # "vllm" (OpenAI-compatible HTTP) or "litellm"
    input_usd_per_token: Decimal | None = None
    output_usd_per_token: Decimal | None = None
    """List prices, for rules that cap the cost per request; ``None``: unknown."""
    capabilities: frozenset[Capability] = DEFAULT_CAPABILITIES
    """What it can serve besides text (``router.capabilities``)."""
    accepts_continuation: bool | None = None
    """Continues an assistant message it is given (vLLM's ``continue_final_message``);
    ``None``: as its provider does (``vllm`` yes, hosted APIs no)."""
    fallbacks: tuple[str, ...] = ()
    """The deployments to try after this one, in order, when a request named it."""

    @property
    def continues(self) -> bool:
        """Whether a broken stream may go on here as a continued assistant message."""
        if self.accepts_continuation is not None:
            return self.accepts_continuation
        return self.provider == "vllm"

    @property
    def external(self) -> bool:
        """Served outside our GPUs (the external tier, or any litellm provider)."""
        return self.tier is Tier.EXTERNAL or self.provider == "litellm"

    def worst_cost(self, prompt_tokens: int, max_tokens: int) -> Decimal | None:
        """The most a request can cost here: the prompt, plus ``max_tokens`` of output."""
        if self.input_usd_per_token is None or self.output_usd_per_token is None:
            return None
        return self.input_usd_per_token * prompt_tokens + self.output_usd_per_token * max_tokens


@dataclass(frozen=True, slots=True)
class Catalog:
    """Every deployment, in the order each tier tries them."""

    deployments: tuple[DeploymentSpec, ...]
    aliases: ModelAliases = field(default_factory=ModelAliases)
    """The global model aliases (the config's ``aliases``)."""

    def get(self, model: str) -> DeploymentSpec | None:
        for spec in self.deployments:
            if spec.model == model:
                return spec
        return None

    def of_tier(self, tier: Tier) -> tuple[DeploymentSpec, ...]:
        return tuple(spec for spec in self.deployments if spec.tier is tier)


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    """A tenant's routing settings (the rule language of a later version grows from these)."""

    tenant: str
    default_tier: Tier = Tier.SMALL
    allowed_tiers: frozenset[Tier] = frozenset(Tier)
    threshold: float = 0.5
    """Classifier score at or above which ``model="auto"`` goes to the large tier."""
    allowed_models: frozenset[str] | None = None
    """Deployments the tenant may name directly; ``None``: every deployment of an allowed tier."""
    aliases: ModelAliases = field(default_factory=ModelAliases)
    """The tenant's own model aliases (tried before the global ones)."""


@dataclass(frozen=True, slots=True)
class Signals:
    """Live state the planner may use: a snapshot, taken before the (pure) decision."""

    unavailable: frozenset[str] = frozenset()
    """Deployments to skip (circuit open, all replicas unhealthy)."""
    expected_wait_s: Mapping[Tier, float] = field(default_factory=dict)
    """Expected queue wait of a new job per tier (s): at the edge, of this request's job in its
    lane, behind the higher lanes and its tenant's fair share of its own."""
    service_s: Mapping[Tier, float] = field(default_factory=dict)
    """Typical backend time of a job per tier (s): a worker does not start a job with less time
    left than this (deadline spill-over reads it)."""
    own_scores: ScoreQuantiles | None = None
    """The tenant's recent classifier scores (``router.share``): a rule's
    ``target_large_share`` is read off them once they number ``min_own_scores`` or more."""
    min_own_scores: int = 200
    """Fewer scores than this: ``target_large_share`` uses the documented mix's curve."""
