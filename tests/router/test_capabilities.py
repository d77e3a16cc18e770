"""Capabilities: what a request needs (``router.capabilities``) and how the planner keeps it off
the deployments that cannot serve it."""

from __future__ import annotations

from typing import Any

import pytest

from router.capabilities import DEFAULT_CAPABILITIES, Capability, needed_capabilities, screen
from router.catalog import Catalog, DeploymentSpec, Signals, TenantPolicy, Tier
from router.errors import MissingCapability
from router.features import PromptFeatures
from router.plan import RoutePlan
from router.planner import decide
from router.rules import RuleSet, parse_rules

V, T, J, R = Capability.VISION, Capability.TOOLS, Capability.JSON_SCHEMA, Capability.REASONING
SMALL = DeploymentSpec("llama-3.1-8b-instruct", Tier.SMALL, max_model_len=16_384)
LARGE = DeploymentSpec("llama-3.1-70b-instruct-awq", Tier.LARGE, max_model_len=8_192)
VISION_SMALL = DeploymentSpec(
    "qwen2.5-vl-7b", Tier.SMALL, max_model_len=32_768, capabilities=frozenset({V, T, J})
)
EXTERNAL = DeploymentSpec(
    "gpt-4o-mini", Tier.EXTERNAL, max_model_len=128_000, provider="litellm",
    capabilities=frozenset({V, T, J}),
)  # fmt: skip
REASONER = DeploymentSpec(
    "o4-mini", Tier.EXTERNAL, max_model_len=200_000, provider="litellm",
    capabilities=frozenset({T, J, R}),
)  # fmt: skip
CATALOG = Catalog((SMALL, LARGE, EXTERNAL))
POLICY = TenantPolicy(tenant="acme")
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
LOOK = [{"role": "user", "content": [{"type": "text", "text": "What is in it?"}, IMAGE]}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


class FixedScore:
    def __init__(self, value: float) -> None:
        self.value = value

    def score(self, features: PromptFeatures) -> float:
        return self.value


def plan_for(
    body: dict[str, Any],
    model: str = "auto",
    *,
    score: float = 0.2,
    catalog: Catalog = CATALOG,
    policy: TenantPolicy = POLICY,
    rules: RuleSet | None = None,
    signals: Signals | None = None,
) -> RoutePlan:
    return decide(
        requested_model=model,
        features=PromptFeatures.from_messages(body.get("messages", LOOK)),
        max_tokens=256,
        policy=policy,
        catalog=catalog,
        signals=signals or Signals(),
        classifier=FixedScore(score),
        rules=rules,
        needs=needed_capabilities(body),
    )


@pytest.mark.parametrize(
    ("body", "needs"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, set()),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}, set()),
        ({"messages": LOOK}, {V}),
        ({"messages": [{"role": "system", "content": "s"}, *LOOK]}, {V}),
        ({"messages": [], "tools": [TOOL]}, {T}),
        ({"messages": [], "tools": []}, set()),
        ({"messages": [], "tool_choice": "none"}, set()),
        ({"messages": [], "tool_choice": "required"}, {T}),
        ({"messages": [], "functions": [TOOL["function"]]}, {T}),
        ({"messages": [], "function_call": "auto"}, {T}),
        ({"messages": [], "response_format": {"type": "json_object"}}, set()),
        ({"messages": [], "response_format": {"type": "json_schema", "json_schema": {}}}, {J}),
        ({"messages": [], "reasoning_effort": "high"}, {R}),
        ({"messages": [], "reasoning_effort": None}, set()),
        ({"messages": [], "reasoning": {"effort": "low"}}, {R}),
        ({"messages": [], "thinking": {"type": "enabled", "budget_tokens": 1024}}, {R}),
        ({"messages": LOOK, "tools": [TOOL], "reasoning_effort": "low",
          "response_format": {"type": "json_schema", "json_schema": {}}}, {V, T, J, R}),
        ({"messages": "not a list", "tools": "x"}, {T}),
        ({"messages": [{"role": "user", "content": [None, "text", IMAGE]}]}, {V}),
    ],
)  # fmt: skip
def test_what_a_request_needs(body: dict[str, Any], needs: set[Capability]) -> None:
    assert needed_capabilities(body) == needs


def test_a_deployment_serves_tools_and_schemas_unless_told() -> None:
    assert SMALL.capabilities == DEFAULT_CAPABILITIES == frozenset({T, J})


def test_screen_keeps_the_catalog_when_nothing_is_needed() -> None:
    assert screen(CATALOG, frozenset()).catalog is CATALOG
    assert screen(CATALOG, frozenset({T})).catalog is CATALOG  # every deployment has tools


def test_a_vision_request_skips_the_text_only_models() -> None:
    plan = plan_for({"messages": LOOK})
    assert plan.deployments == (EXTERNAL.model,) and plan.tier is Tier.EXTERNAL
    assert plan.needs == ("vision",)
    assert plan.ruled_out == ((SMALL.model, ("vision",)), (LARGE.model, ("vision",)))
    assert "no small deployment → external" in plan.reason
    assert f"needs vision: not {SMALL.model} (no vision); {LARGE.model} (no vision)" in plan.reason
    shown = plan.to_dict()
    assert shown["ruled_out"][0] == {"deployment": SMALL.model, "missing": ["vision"]}
    assert RoutePlan.from_dict(shown) == plan


def test_a_vision_deployment_of_the_chosen_tier_is_kept_first() -> None:
    catalog = Catalog((SMALL, VISION_SMALL, LARGE, EXTERNAL))
    plan = plan_for({"messages": LOOK}, catalog=catalog)
    assert plan.deployments == (VISION_SMALL.model, EXTERNAL.model)
    assert plan.tier is Tier.SMALL


def test_without_images_nothing_changes() -> None:
    text = {"messages": [{"role": "user", "content": "hi"}]}
    plan = plan_for(text)
    assert plan.deployments == (SMALL.model, LARGE.model, EXTERNAL.model)
    assert plan.needs == () and plan.ruled_out == () and "needs" not in plan.reason


def test_a_capability_a_deployment_lacks_in_config_rules_it_out() -> None:
    no_tools = DeploymentSpec("base-8b", Tier.SMALL, 8_192, capabilities=frozenset())
    catalog = Catalog((no_tools, SMALL, LARGE))
    plan = plan_for({"messages": [{"role": "user", "content": "x"}], "tools": [TOOL]},
                    catalog=catalog)  # fmt: skip
    assert plan.deployments == (SMALL.model, LARGE.model)
    assert plan.ruled_out == (("base-8b", ("tools",)),)


def test_reasoning_goes_to_the_reasoning_deployment_only() -> None:
    catalog = Catalog((SMALL, LARGE, EXTERNAL, REASONER))
    plan = plan_for({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "high"},
                    catalog=catalog, score=0.9)  # fmt: skip
    assert plan.deployments == (REASONER.model,)
    assert {d for d, _ in plan.ruled_out} == {SMALL.model, LARGE.model, EXTERNAL.model}


def test_a_pinned_deployment_without_the_capability_is_refused() -> None:
    with pytest.raises(MissingCapability) as refused:
        plan_for({"messages": LOOK}, SMALL.model)
    assert refused.value.capability == "vision" and refused.value.param == "messages"
    assert f"model {SMALL.model!r} does not support vision" in refused.value.message
    assert plan_for({"messages": LOOK}, EXTERNAL.model).deployments == (EXTERNAL.model,)


def test_a_pinned_tier_falls_back_to_a_capable_one() -> None:
    plan = plan_for({"messages": LOOK}, "small")
    assert plan.deployments == (EXTERNAL.model,)


def test_nothing_allowed_can_serve_it() -> None:
    local = TenantPolicy(tenant="initech", allowed_tiers=frozenset({Tier.SMALL, Tier.LARGE}))
    with pytest.raises(MissingCapability) as refused:
        plan_for({"messages": LOOK}, policy=local)
    message = refused.value.message
    assert refused.value.capability == "vision" and refused.value.param == "messages"
    assert message.startswith(
        "no deployment this request may use supports vision (image parts in messages)"
    )
    assert SMALL.model in message and LARGE.model in message and EXTERNAL.model not in message


def test_the_first_missing_capability_is_named_with_its_field() -> None:
    body = {"messages": LOOK, "reasoning_effort": "low"}
    with pytest.raises(MissingCapability) as refused:
        plan_for(body, catalog=Catalog((SMALL, EXTERNAL, REASONER)))
    # no deployment has both: each lacks one; the refusal names both, vision first
    assert "vision (image parts in messages) and reasoning" in refused.value.message
    assert refused.value.param == "messages"
    with pytest.raises(MissingCapability) as tools:
        plan_for({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"},
                 catalog=Catalog((DeploymentSpec("m", Tier.SMALL, 8_192,
                                                 capabilities=frozenset()),)))  # fmt: skip
    assert tools.value.capability == "tools" and tools.value.param == "tools"


def test_a_rule_that_names_an_incapable_deployment_routes_to_a_capable_one() -> None:
    rules = parse_rules(
        f"rules:\n  - id: cheap\n    when: {{}}\n    then: {{deployment: {SMALL.model}}}\n"
    )
    text = plan_for({"messages": [{"role": "user", "content": "x"}]}, rules=rules)
    assert text.rule == "rule:cheap" and text.deployments[0] == SMALL.model
    plan = plan_for({"messages": LOOK}, rules=rules)
    assert plan.deployments == (EXTERNAL.model,)
    assert plan.ruled_out[0] == (SMALL.model, ("vision",))


def test_spill_skips_a_tier_that_cannot_serve_the_request() -> None:
    """The large tier's wait is over target and spill goes to small first: a vision request
    bound for a vision-capable large deployment must not spill to the text-only small tier
    (it would be refused there); it spills to the capable external one."""
    vision_large = DeploymentSpec("llava-72b", Tier.LARGE, 32_768, capabilities=frozenset({V}))
    catalog = Catalog((SMALL, LARGE, vision_large, EXTERNAL))
    rules = parse_rules("defaults: {spill_to: [small, external]}\n")
    signals = Signals(expected_wait_s={Tier.LARGE: 120.0})
    plan = plan_for({"messages": LOOK}, score=0.9, catalog=catalog, signals=signals, rules=rules)
    assert plan.rule == "spill:large_wait" and plan.deployments[0] == EXTERNAL.model
    text = plan_for({"messages": [{"role": "user", "content": "x"}]}, score=0.9,
                    catalog=catalog, signals=signals, rules=rules)  # fmt: skip
    assert text.rule == "spill:large_wait" and text.deployments[0] == SMALL.model
