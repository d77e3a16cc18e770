"""Reasoning parameters and ``verbosity`` as hints: a model named through an alias is planned as
if they were absent, and each deployment is sent them only where it can take them
(``router.capabilities.hint_fields`` / ``unsent``); a model named directly keeps them as needs."""

from __future__ import annotations

from typing import Any

import pytest

from router.aliases import ModelAliases
from router.capabilities import (
    Capability,
    hint_fields,
    needed_capabilities,
    no_reasoning_fields,
    unsent,
)
from router.catalog import Catalog, DeploymentSpec, Signals, TenantPolicy, Tier
from router.errors import MissingCapability
from router.features import PromptFeatures
from router.plan import RoutePlan
from router.planner import decide

T, J, R = Capability.TOOLS, Capability.JSON_SCHEMA, Capability.REASONING
SMALL = DeploymentSpec("llama-3.1-8b-instruct", Tier.SMALL, max_model_len=16_384)
LARGE = DeploymentSpec("llama-3.1-70b-instruct-awq", Tier.LARGE, max_model_len=8_192)
EXTERNAL = DeploymentSpec("gpt-4o-mini", Tier.EXTERNAL, max_model_len=128_000, provider="litellm")
REASONER = DeploymentSpec(
    "o4-mini", Tier.EXTERNAL, max_model_len=200_000, provider="litellm",
    capabilities=frozenset({T, J, R}),
)  # fmt: skip
LOCAL_REASONER = DeploymentSpec(
    "qwen3-32b", Tier.LARGE, max_model_len=32_768, capabilities=frozenset({T, J, R})
)
ALIASES = ModelAliases.of({"gpt-5*": "auto", "o3*": "large", "gpt-5-nano": SMALL.model})
TEXT_ONLY = Catalog((SMALL, LARGE, EXTERNAL), aliases=ALIASES)
POLICY = TenantPolicy(tenant="acme")
ASK = [{"role": "user", "content": "What is 2 + 2?"}]
HINTS = {"reasoning_effort": "low", "verbosity": "low"}


class FixedScore:
    def __init__(self, value: float) -> None:
        self.value = value

    def score(self, features: PromptFeatures) -> float:
        return self.value


def plan_for(
    body: dict[str, Any], model: str, *, catalog: Catalog = TEXT_ONLY, score: float = 0.2
) -> RoutePlan:
    return decide(
        requested_model=model,
        features=PromptFeatures.from_messages(ASK),
        max_tokens=256,
        policy=POLICY,
        catalog=catalog,
        signals=Signals(),
        classifier=FixedScore(score),
        needs=needed_capabilities(body),
        hints=hint_fields(body),
        quiet=no_reasoning_fields(body),
    )


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({}, ()),
        ({"reasoning_effort": "low"}, ("reasoning_effort",)),
        ({"verbosity": "low", "reasoning_effort": "none"}, ("reasoning_effort", "verbosity")),
        ({"thinking": {"type": "enabled"}, "reasoning": None}, ("thinking",)),
        ({"reasoning": {"effort": "high"}, "thinking": False}, ("reasoning",)),
    ],
)
def test_the_hint_fields_of_a_body(body: dict[str, Any], fields: tuple[str, ...]) -> None:
    assert hint_fields(body) == fields


def test_what_each_kind_of_deployment_is_not_sent() -> None:
    every = ("reasoning_effort", "reasoning", "thinking", "verbosity")
    assert unsent(every, SMALL) == every  # vLLM, no reasoning
    assert unsent(every, EXTERNAL) == every  # litellm, no reasoning
    assert unsent(every, LOCAL_REASONER) == ("verbosity",)  # vLLM takes no verbosity
    assert unsent(every, REASONER) == ()


def test_an_aliased_model_with_reasoning_is_planned_as_without_it() -> None:
    plan = plan_for({"messages": ASK, **HINTS}, "gpt-5.6-luna")
    assert plan.deployments[0] == SMALL.model and plan.needs == () and plan.ruled_out == ()
    assert plan.dropped == tuple((d, ("reasoning_effort", "verbosity")) for d in plan.deployments)
    assert plan.dropped_for(SMALL.model) == ("reasoning_effort", "verbosity")
    assert "hints not sent (alias) to llama-3.1-8b-instruct: reasoning_effort, verbosity" in (
        plan.reason
    )
    plain = plan_for({"messages": ASK}, "gpt-5.6-luna")
    assert plain.deployments == plan.deployments and plain.dropped == ()


def test_an_aliased_model_keeps_its_hints_where_a_deployment_reasons() -> None:
    catalog = Catalog((SMALL, LOCAL_REASONER, REASONER), aliases=ALIASES)
    plan = plan_for({"messages": ASK, **HINTS}, "gpt-5", catalog=catalog, score=0.9)
    assert plan.deployments == (LOCAL_REASONER.model, REASONER.model, SMALL.model)
    assert plan.dropped == (
        (LOCAL_REASONER.model, ("verbosity",)),
        (SMALL.model, ("reasoning_effort", "verbosity")),
    )
    assert plan.dropped_for(REASONER.model) == ()


def test_an_alias_to_a_deployment_drops_what_it_cannot_take() -> None:
    plan = plan_for({"messages": ASK, "reasoning_effort": "high"}, "gpt-5-nano")
    assert plan.deployments == (SMALL.model,) and plan.rule == "pin:model"
    assert plan.dropped == ((SMALL.model, ("reasoning_effort",)),)


@pytest.mark.parametrize("model", ["auto", "large", "small", SMALL.model])
def test_a_model_named_directly_still_needs_a_deployment_that_reasons(model: str) -> None:
    with pytest.raises(MissingCapability) as refused:
        plan_for({"messages": ASK, "reasoning_effort": "low"}, model)
    assert refused.value.capability == "reasoning"
    assert refused.value.param == "reasoning_effort"


def test_a_model_named_directly_drops_nothing() -> None:
    catalog = Catalog((SMALL, LOCAL_REASONER, REASONER), aliases=ALIASES)
    plan = plan_for({"messages": ASK, **HINTS}, "auto", catalog=catalog, score=0.9)
    assert plan.deployments == (LOCAL_REASONER.model, REASONER.model)
    assert plan.needs == ("reasoning",) and plan.dropped == ()
    verbose = plan_for({"messages": ASK, "verbosity": "high"}, "auto")
    assert verbose.dropped == ()  # verbosity alone needs nothing, and is passed on as before


def test_dropped_survives_the_job_encoding() -> None:
    plan = plan_for({"messages": ASK, **HINTS}, "o3-mini")
    assert plan.dropped and RoutePlan.from_dict(plan.to_dict()) == plan
    assert plan.to_dict()["dropped"][0] == {
        "deployment": LARGE.model,
        "fields": ["reasoning_effort", "verbosity"],
    }


@pytest.mark.parametrize(
    ("body", "needs", "quiet"),
    [
        ({"reasoning_effort": "none"}, frozenset(), ("reasoning_effort",)),
        ({"reasoning_effort": "minimal"}, {R}, ()),
        ({"reasoning": {"effort": "none"}}, frozenset(), ("reasoning",)),
        ({"reasoning": {"effort": "low"}}, {R}, ()),
        ({"thinking": {"type": "disabled"}}, frozenset(), ("thinking",)),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, {R}, ()),
        ({"reasoning_effort": "none", "thinking": {"type": "enabled"}}, {R}, ("reasoning_effort",)),
    ],
)
def test_a_reasoning_field_that_asks_for_none_needs_nothing(
    body: dict[str, Any], needs: frozenset[Capability], quiet: tuple[str, ...]
) -> None:
    assert needed_capabilities(body) == needs
    assert no_reasoning_fields(body) == quiet


@pytest.mark.parametrize("model", ["auto", "large", "small", SMALL.model])
def test_a_model_named_directly_with_no_reasoning_asked_is_served_without_the_field(
    model: str,
) -> None:
    """GPT-5.1-style ``reasoning_effort: "none"`` on a tiergate model: nothing to rule out;
    a deployment without ``reasoning`` is not sent the field (vLLM may refuse the value)."""
    plan = plan_for({"messages": ASK, "reasoning_effort": "none"}, model)
    assert plan.needs == () and plan.ruled_out == ()
    assert plan.dropped == tuple((d, ("reasoning_effort",)) for d in plan.deployments)
    assert "hints not sent (no reasoning asked) to " in plan.reason


def test_no_reasoning_asked_is_still_sent_where_a_deployment_reasons() -> None:
    catalog = Catalog((SMALL, LOCAL_REASONER, REASONER), aliases=ALIASES)
    plan = plan_for({"messages": ASK, "reasoning_effort": "none"}, "auto", catalog=catalog)
    assert plan.deployments[0] == SMALL.model
    assert plan.dropped == ((SMALL.model, ("reasoning_effort",)),)
