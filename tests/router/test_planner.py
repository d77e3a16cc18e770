from __future__ import annotations

import dataclasses
import re

import pytest

from router.catalog import Catalog, DeploymentSpec, Signals, TenantPolicy, Tier
from router.errors import ModelNotAllowed, NoDeploymentFits, UnknownModel
from router.features import PromptFeatures
from router.plan import RoutePlan
from router.planner import decide

SMALL = DeploymentSpec("llama-3.1-8b-instruct", Tier.SMALL, max_model_len=8_192)
SMALL_LONG = DeploymentSpec("llama-3.1-8b-instruct-long", Tier.SMALL, max_model_len=32_768)
LARGE = DeploymentSpec("llama-3.1-70b-instruct", Tier.LARGE, max_model_len=16_384)
EXTERNAL = DeploymentSpec("gpt-4o", Tier.EXTERNAL, max_model_len=128_000, provider="litellm")
CATALOG = Catalog((SMALL, SMALL_LONG, LARGE, EXTERNAL))
ALL = (SMALL.model, SMALL_LONG.model, LARGE.model, EXTERNAL.model)
POLICY = TenantPolicy(tenant="acme", threshold=0.5)
FEATURES = PromptFeatures.from_text("What is the capital of France?")


class FixedScore:
    def __init__(self, score: float) -> None:
        self.value = score
        self.calls = 0

    def score(self, features: PromptFeatures) -> float:
        self.calls += 1
        return self.value


class Broken:
    def score(self, features: PromptFeatures) -> float:
        raise RuntimeError("model exploded")


def plan_for(
    requested_model: str = "auto",
    *,
    score: float | None = 0.2,
    policy: TenantPolicy = POLICY,
    catalog: Catalog = CATALOG,
    signals: Signals | None = None,
    prompt_tokens: int | None = None,
    max_tokens: int = 256,
) -> RoutePlan:
    features = FEATURES
    if prompt_tokens is not None:
        features = dataclasses.replace(FEATURES, estimated_prompt_tokens=prompt_tokens)
    return decide(
        requested_model=requested_model,
        features=features,
        max_tokens=max_tokens,
        policy=policy,
        catalog=catalog,
        signals=signals or Signals(),
        classifier=None if score is None else FixedScore(score),
    )


# --- auto ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("score", "tier", "deployments", "reason"),
    [
        (0.71, Tier.LARGE, (LARGE.model, EXTERNAL.model, SMALL.model, SMALL_LONG.model),
         "score 0.71 ≥ threshold 0.50 → large"),
        (0.5, Tier.LARGE, (LARGE.model, EXTERNAL.model, SMALL.model, SMALL_LONG.model),
         "score 0.50 ≥ threshold 0.50 → large"),
        (0.23, Tier.SMALL, ALL, "score 0.23 < threshold 0.50 → small"),
        (0.0, Tier.SMALL, ALL, "score 0.00 < threshold 0.50 → small"),
        (1.0, Tier.LARGE, (LARGE.model, EXTERNAL.model, SMALL.model, SMALL_LONG.model),
         "score 1.00 ≥ threshold 0.50 → large"),
    ],
)  # fmt: skip
def test_auto_uses_the_threshold(
    score: float, tier: Tier, deployments: tuple[str, ...], reason: str
) -> None:
    plan = plan_for(score=score)
    assert plan == RoutePlan(
        tier=tier,
        deployments=deployments,
        rule="auto:threshold",
        reason=reason,
        score=score,
        requested_model="auto",
        threshold=0.5,  # the tenant's, in force for auto
    )


@pytest.mark.parametrize(
    ("score", "threshold", "reason"),
    [
        (0.3281, 0.328, "score 0.3281 ≥ threshold 0.3280 → large"),
        (0.3291, 0.328, "score 0.329 ≥ threshold 0.328 → large"),
        (0.3279, 0.328, "score 0.3279 < threshold 0.3280 → small"),
        (0.33, 0.33, "score 0.33 ≥ threshold 0.33 → large"),
    ],
)
def test_reason_never_shows_equal_numbers_on_different_sides(
    score: float, threshold: float, reason: str
) -> None:
    plan = plan_for(score=score, policy=dataclasses.replace(POLICY, threshold=threshold))
    assert plan.reason == reason


def test_auto_uses_the_tenants_threshold() -> None:
    plan = plan_for(score=0.3, policy=dataclasses.replace(POLICY, threshold=0.25))
    assert plan.tier is Tier.LARGE
    assert plan.reason == "score 0.30 ≥ threshold 0.25 → large"


@pytest.mark.parametrize("default", [Tier.SMALL, Tier.LARGE, Tier.EXTERNAL])
def test_failing_classifier_fails_open_to_the_default_tier(default: Tier) -> None:
    plan = decide(
        requested_model="auto",
        features=FEATURES,
        max_tokens=256,
        policy=dataclasses.replace(POLICY, default_tier=default),
        catalog=CATALOG,
        signals=Signals(),
        classifier=Broken(),
    )
    assert plan.tier is default
    assert plan.rule == "classifier_failed"
    assert plan.score is None
    assert "RuntimeError" in plan.reason


@pytest.mark.parametrize("bad", [float("nan"), -0.1, 1.5, float("inf")])
def test_out_of_range_score_counts_as_failure(bad: float) -> None:
    plan = plan_for(score=bad)
    assert plan.rule == "classifier_failed"
    assert plan.tier is Tier.SMALL
    assert plan.score is None


def test_no_classifier_routes_to_the_default_tier() -> None:
    plan = plan_for(score=None, policy=dataclasses.replace(POLICY, default_tier=Tier.LARGE))
    assert (plan.tier, plan.rule, plan.score) == (Tier.LARGE, "auto:default", None)


@pytest.mark.parametrize(
    ("score", "allowed", "tier", "deployments", "note"),
    [
        (0.9, {Tier.SMALL, Tier.EXTERNAL}, Tier.EXTERNAL,
         (EXTERNAL.model, SMALL.model, SMALL_LONG.model), "large not allowed → external"),
        (0.9, {Tier.SMALL}, Tier.SMALL, (SMALL.model, SMALL_LONG.model),
         "large not allowed → small"),
        (0.1, {Tier.LARGE}, Tier.LARGE, (LARGE.model,), "small not allowed → large"),
        (0.1, {Tier.EXTERNAL}, Tier.EXTERNAL, (EXTERNAL.model,), "small not allowed → external"),
        (0.1, {Tier.SMALL, Tier.LARGE}, Tier.SMALL, (SMALL.model, SMALL_LONG.model, LARGE.model),
         None),
    ],
)  # fmt: skip
def test_auto_takes_the_nearest_allowed_tier(
    score: float,
    allowed: set[Tier],
    tier: Tier,
    deployments: tuple[str, ...],
    note: str | None,
) -> None:
    plan = plan_for(
        score=score, policy=dataclasses.replace(POLICY, allowed_tiers=frozenset(allowed))
    )
    assert plan.tier is tier
    assert plan.deployments == deployments
    assert plan.rule == "auto:threshold"
    if note is not None:
        assert note in plan.reason
    else:
        assert "not allowed" not in plan.reason


def test_tenant_without_tiers_is_refused() -> None:
    with pytest.raises(ModelNotAllowed):
        plan_for(policy=dataclasses.replace(POLICY, allowed_tiers=frozenset()))


# --- tier pins ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tier", "deployments"),
    [
        ("small", ALL),
        ("large", (LARGE.model, EXTERNAL.model, SMALL.model, SMALL_LONG.model)),
        ("external", (EXTERNAL.model, LARGE.model, SMALL.model, SMALL_LONG.model)),
    ],
)
def test_tier_pin_chains_in_fallback_order(tier: str, deployments: tuple[str, ...]) -> None:
    classifier = FixedScore(0.99)
    plan = decide(
        requested_model=tier,
        features=FEATURES,
        max_tokens=256,
        policy=POLICY,
        catalog=CATALOG,
        signals=Signals(),
        classifier=classifier,
    )
    assert plan == RoutePlan(
        tier=Tier(tier),
        deployments=deployments,
        rule="pin:tier",
        reason=f"tier {tier} requested",
        score=None,
        requested_model=tier,
    )
    assert classifier.calls == 0


def test_tier_pin_skips_disallowed_fallback_tiers() -> None:
    policy = dataclasses.replace(POLICY, allowed_tiers=frozenset({Tier.LARGE, Tier.SMALL}))
    plan = plan_for("large", policy=policy)
    assert plan.deployments == (LARGE.model, SMALL.model, SMALL_LONG.model)


@pytest.mark.parametrize("tier", ["small", "large", "external"])
def test_tier_pin_of_a_disallowed_tier_is_refused(tier: str) -> None:
    allowed = frozenset(set(Tier) - {Tier(tier)})
    with pytest.raises(ModelNotAllowed, match=tier):
        plan_for(tier, policy=dataclasses.replace(POLICY, allowed_tiers=allowed))


# --- model pins --------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [SMALL, SMALL_LONG, LARGE, EXTERNAL])
def test_model_pin_uses_only_that_deployment(spec: DeploymentSpec) -> None:
    plan = plan_for(spec.model, score=0.99)
    assert plan == RoutePlan(
        tier=spec.tier,
        deployments=(spec.model,),
        rule="pin:model",
        reason=f"model {spec.model} requested",
        score=None,
        requested_model=spec.model,
    )


def test_model_pin_of_a_disallowed_tier_is_refused() -> None:
    policy = dataclasses.replace(POLICY, allowed_tiers=frozenset({Tier.SMALL}))
    with pytest.raises(ModelNotAllowed, match=re.escape(LARGE.model)):
        plan_for(LARGE.model, policy=policy)


def test_model_pin_respects_allowed_models() -> None:
    policy = dataclasses.replace(POLICY, allowed_models=frozenset({SMALL.model}))
    assert plan_for(SMALL.model, policy=policy).deployments == (SMALL.model,)
    with pytest.raises(ModelNotAllowed):
        plan_for(SMALL_LONG.model, policy=policy)
    # allowed_models restricts naming deployments, not tiers
    assert plan_for("small", policy=policy).deployments == ALL


def test_model_pin_keeps_an_unavailable_deployment_and_says_so() -> None:
    plan = plan_for(LARGE.model, signals=Signals(unavailable=frozenset({LARGE.model})))
    assert plan.deployments == (LARGE.model,)
    assert "unavailable" in plan.reason


@pytest.mark.parametrize("model", ["gpt-5", "", "AUTO", "Small", "llama-3.1-8b"])
def test_unknown_models_are_refused(model: str) -> None:
    with pytest.raises(UnknownModel):
        plan_for(model)


# --- signals -----------------------------------------------------------------------------


def test_unavailable_deployments_move_to_the_end_in_order() -> None:
    signals = Signals(unavailable=frozenset({SMALL.model, LARGE.model}))
    plan = plan_for(score=0.1, signals=signals)
    assert plan.deployments == (SMALL_LONG.model, EXTERNAL.model, SMALL.model, LARGE.model)
    assert plan.tier is Tier.SMALL
    assert "unavailable" not in plan.reason
    assert plan.preferred == plan.first_choice == SMALL.model  # what an answer falls back from


def test_whole_tier_unavailable_starts_with_the_next_tier() -> None:
    signals = Signals(unavailable=frozenset({SMALL.model, SMALL_LONG.model}))
    plan = plan_for(score=0.1, signals=signals)
    assert plan.deployments == (LARGE.model, EXTERNAL.model, SMALL.model, SMALL_LONG.model)
    assert plan.tier is Tier.LARGE
    assert plan.reason.endswith("small unavailable → large first")
    assert plan.first_choice == SMALL.model  # the large tier's answer counts as a fallback
    assert RoutePlan.from_dict(plan.to_dict()) == plan  # it travels with the job


def test_nothing_unavailable_nothing_preferred() -> None:
    plan = plan_for(score=0.1)
    assert plan.preferred is None and plan.first_choice == plan.deployments[0]


def test_everything_unavailable_keeps_the_order() -> None:
    plan = plan_for(score=0.9, signals=Signals(unavailable=frozenset(ALL)))
    assert plan.deployments == (LARGE.model, EXTERNAL.model, SMALL.model, SMALL_LONG.model)
    assert plan.tier is Tier.LARGE
    assert plan.preferred is None  # nothing available moved ahead of it


# --- context fit -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt_tokens", "requested", "tier", "deployments"),
    [
        (7_936, "auto", Tier.SMALL, ALL),  # 7,936 + 256 = 8,192 fits exactly
        (7_937, "auto", Tier.SMALL, (SMALL_LONG.model, LARGE.model, EXTERNAL.model)),
        (20_000, "auto", Tier.SMALL, (SMALL_LONG.model, EXTERNAL.model)),
        (20_000, "large", Tier.EXTERNAL, (EXTERNAL.model, SMALL_LONG.model)),
        (40_000, "auto", Tier.EXTERNAL, (EXTERNAL.model,)),
        (40_000, "small", Tier.EXTERNAL, (EXTERNAL.model,)),
    ],
)
def test_context_fit_drops_deployments_that_are_too_small(
    prompt_tokens: int, requested: str, tier: Tier, deployments: tuple[str, ...]
) -> None:
    plan = plan_for(requested, score=0.1, prompt_tokens=prompt_tokens)
    assert plan.tier is tier
    assert plan.deployments == deployments


def test_moving_tier_for_context_is_explained() -> None:
    plan = plan_for(score=0.9, prompt_tokens=20_000, max_tokens=1_000)
    assert plan.tier is Tier.EXTERNAL
    assert plan.rule == "auto:threshold"
    assert plan.reason == (
        "score 0.90 ≥ threshold 0.50 → large; no large deployment fits 21,000 tokens → external"
    )


def test_no_fitting_deployment_raises() -> None:
    with pytest.raises(NoDeploymentFits, match="128,000"):
        plan_for(prompt_tokens=127_900, max_tokens=200)


def test_context_fit_only_counts_allowed_tiers() -> None:
    policy = dataclasses.replace(POLICY, allowed_tiers=frozenset({Tier.SMALL, Tier.LARGE}))
    with pytest.raises(NoDeploymentFits, match="32,768"):
        plan_for(prompt_tokens=40_000, policy=policy)


def test_model_pin_that_does_not_fit_raises() -> None:
    with pytest.raises(NoDeploymentFits):
        plan_for(SMALL.model, prompt_tokens=9_000)


def test_unconfigured_tier_moves_on_and_says_so() -> None:
    catalog = Catalog((SMALL, LARGE))
    plan = plan_for("external", catalog=catalog)
    assert plan.tier is Tier.LARGE
    assert plan.deployments == (LARGE.model, SMALL.model)
    assert plan.reason == "tier external requested; no external deployment → large"


def test_empty_catalog_raises() -> None:
    with pytest.raises(NoDeploymentFits, match="no deployment is configured"):
        plan_for(catalog=Catalog(()))


# --- purity ------------------------------------------------------------------------------


def test_decide_is_deterministic() -> None:
    signals = Signals(unavailable=frozenset({SMALL.model}))
    plans = {plan_for(score=0.42, signals=signals, prompt_tokens=9_000) for _ in range(5)}
    assert len(plans) == 1


def test_plan_round_trips_through_dict() -> None:
    plan = plan_for(score=0.8)
    assert RoutePlan.from_dict(plan.to_dict()) == plan
