"""Per-deployment fallback chains (``DeploymentSpec.fallbacks``, the config's ``fallbacks:``):
a deployment named by the request, or by a rule's ``deployment`` action, is followed by its
configured chain and nothing else (never the rest of its tier), and the plan says whose chain
it is (``fallbacks_of``, shown by ``/v1/route/explain``)."""

from __future__ import annotations

import dataclasses
from decimal import Decimal

import pytest

from router.catalog import Catalog, DeploymentSpec, Signals, TenantPolicy, Tier
from router.errors import ModelNotAllowed, NoDeploymentFits
from router.features import PromptFeatures
from router.plan import RoutePlan
from router.planner import decide
from router.rules import parse_rules

SMALL = DeploymentSpec("small-a", Tier.SMALL, 16_384)
SMALL_B = DeploymentSpec("small-b", Tier.SMALL, 16_384)
LARGE = DeploymentSpec(
    "large-a", Tier.LARGE, 8_192, fallbacks=("ext-a", "small-a"),
    input_usd_per_token=Decimal("0.000001"), output_usd_per_token=Decimal("0.000001"),
)  # fmt: skip
EXTERNAL = DeploymentSpec(
    "ext-a", Tier.EXTERNAL, 128_000, provider="litellm", fallbacks=("large-a",),
    input_usd_per_token=Decimal("0.001"), output_usd_per_token=Decimal("0.001"),
)  # fmt: skip
CATALOG = Catalog((SMALL, SMALL_B, LARGE, EXTERNAL))
POLICY = TenantPolicy(tenant="acme", threshold=0.5)


def plan(
    model: str = "auto",
    *,
    rules: str = "rules: []",
    policy: TenantPolicy = POLICY,
    signals: Signals | None = None,
    prompt_tokens: int = 20,
    catalog: Catalog = CATALOG,
) -> RoutePlan:
    features = dataclasses.replace(
        PromptFeatures.from_text("hello"), estimated_prompt_tokens=prompt_tokens
    )
    return decide(
        requested_model=model,
        features=features,
        max_tokens=256,
        policy=policy,
        catalog=catalog,
        signals=signals or Signals(),
        classifier=None,
        rules=parse_rules(rules, catalog=catalog),
    )


def test_a_named_deployment_is_followed_by_its_chain() -> None:
    result = plan("large-a")
    assert result.deployments == ("large-a", "ext-a", "small-a")
    assert result.fallbacks_of == "large-a" and result.rule == "pin:model"
    assert "fallbacks: ext-a → small-a" in result.reason
    assert result.to_dict()["fallbacks_of"] == "large-a"  # what explain shows
    assert RoutePlan.from_dict(result.to_dict()) == result


def test_a_deployment_without_a_chain_stands_alone() -> None:
    result = plan("small-b")
    assert result.deployments == ("small-b",) and result.fallbacks_of is None


def test_a_rules_deployment_takes_its_chain_not_its_tier() -> None:
    rules = "rules:\n  - id: r\n    then: {deployment: large-a}\n"
    result = plan(rules=rules)
    assert result.deployments == ("large-a", "ext-a", "small-a")
    assert result.rule == "rule:r" and result.fallbacks_of == "large-a"
    alone = plan(rules="rules:\n  - id: r\n    then: {deployment: small-b}\n")
    assert alone.deployments == ("small-b",)  # never small-a, an unrelated deployment


def test_a_rules_fallback_tiers_come_after_the_chain() -> None:
    rules = "rules:\n  - id: r\n    then: {deployment: small-b, fallback: [large]}\n"
    assert plan(rules=rules).deployments == ("small-b", "large-a")


def test_the_chain_keeps_to_the_allowed_tiers() -> None:
    no_external = dataclasses.replace(POLICY, allowed_tiers=frozenset({Tier.SMALL, Tier.LARGE}))
    assert plan("large-a", policy=no_external).deployments == ("large-a", "small-a")
    rules = "rules:\n  - id: r\n    then: {forbid_external: true}\n"
    assert plan("large-a", rules=rules).deployments == ("large-a", "small-a")
    with pytest.raises(ModelNotAllowed):
        plan("ext-a", policy=no_external)


def test_a_named_deployment_that_does_not_fit_hands_over_to_its_chain() -> None:
    result = plan("large-a", prompt_tokens=9_000)  # over the 70B's 8,192
    assert result.deployments == ("ext-a", "small-a")
    assert "large-a does not fit" in result.reason
    with pytest.raises(NoDeploymentFits):
        plan("large-a", prompt_tokens=200_000)
    with pytest.raises(NoDeploymentFits):
        plan("small-b", prompt_tokens=20_000)  # no chain: nowhere to go


def test_unavailable_members_move_to_the_end() -> None:
    result = plan("large-a", signals=Signals(unavailable=frozenset({"large-a"})))
    assert result.deployments == ("ext-a", "small-a", "large-a")
    assert result.preferred == "large-a" and result.tier is Tier.EXTERNAL


def test_the_cost_cap_drops_chain_members_over_it() -> None:
    rules = "rules:\n  - id: r\n    then: {max_cost_usd: 0.01}\n"
    result = plan("large-a", rules=rules)
    assert result.deployments == ("large-a",)  # ext-a's worst case is over; small-a unpriced
    assert plan("ext-a", rules=rules).deployments == ("large-a",)  # its chain within the cap
    with pytest.raises(ModelNotAllowed):
        plan("small-b", rules=rules)  # unpriced, and no chain
