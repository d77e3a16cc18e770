"""Model aliases: matching, precedence across scopes, and what the planner makes of them."""

from __future__ import annotations

import dataclasses

import pytest

from router.aliases import Alias, ModelAliases, alias_problem
from router.catalog import Catalog, Signals, TenantPolicy, Tier
from router.errors import ModelNotAllowed, UnknownModel
from router.planner import decide
from router.rules.errors import RulesInvalid
from router.rules.source import parse_rules
from tests.router.test_planner import CATALOG, EXTERNAL, FEATURES, LARGE, POLICY, SMALL, FixedScore

GLOBAL = ModelAliases.of(
    {"gpt-4o-mini": "auto", "gpt-4o*": "large", "gpt-*": "small", "o*": "external"}
)


@pytest.mark.parametrize(
    ("name", "found"),
    [
        ("gpt-4o-mini", Alias("gpt-4o-mini", "auto")),  # exact beats every pattern
        ("gpt-4o-2024-08-06", Alias("gpt-4o*", "large")),  # the longer pattern first
        ("gpt-4o", Alias("gpt-4o*", "large")),
        ("gpt-5.6-luna", Alias("gpt-*", "small")),
        ("o3", Alias("o*", "external")),
        ("claude-3", None),
        ("xgpt-4o", None),  # patterns match the whole name
    ],
)
def test_exact_then_the_longest_pattern(name: str, found: Alias | None) -> None:
    assert GLOBAL.resolve(name) == found


def test_an_earlier_scope_wins_even_with_a_pattern() -> None:
    tenant = ModelAliases.of({"gpt-*": "large"})
    assert tenant.then(GLOBAL).resolve("gpt-4o-mini") == Alias("gpt-*", "large")
    assert tenant.then(GLOBAL).resolve("o1") == Alias("o*", "external")
    names = [a.pattern for a in tenant.then(GLOBAL).exact_names()]
    assert names == ["gpt-4o-mini"]


def _plan(
    model: str, policy: TenantPolicy = POLICY, catalog: Catalog = CATALOG, score: float = 0.9
):
    return decide(
        requested_model=model,
        features=FEATURES,
        max_tokens=64,
        policy=policy,
        catalog=catalog,
        signals=Signals(),
        classifier=FixedScore(score),
    )


def test_planner_resolves_aliases_before_routing() -> None:
    catalog = dataclasses.replace(CATALOG, aliases=GLOBAL)
    auto = _plan("gpt-4o-mini", catalog=catalog, score=0.9)
    assert auto.tier is Tier.LARGE and auto.rule == "auto:threshold"
    assert auto.requested_model == "gpt-4o-mini" and auto.alias == "gpt-4o-mini → auto"
    assert auto.reason.startswith("'gpt-4o-mini' is an alias of 'auto'; score 0.90")
    small = _plan("gpt-4o-mini", catalog=catalog, score=0.1)
    assert small.tier is Tier.SMALL
    pinned = _plan("gpt-4o-2024-08-06", catalog=catalog)
    assert pinned.tier is Tier.LARGE and pinned.rule == "pin:tier"
    assert pinned.reason.startswith("'gpt-4o-2024-08-06' is an alias of 'large' (gpt-4o*)")
    # a real deployment id is never an alias, though "gpt-4o*" matches it
    real = _plan(EXTERNAL.model, catalog=catalog)
    assert real.deployments == (EXTERNAL.model,) and real.alias is None
    assert _plan("large", catalog=catalog).alias is None
    with pytest.raises(UnknownModel):
        _plan("claude-3", catalog=catalog)
    with pytest.raises(UnknownModel):
        _plan("gpt-4o-mini")  # no aliases configured


def test_tenant_aliases_come_first_and_their_target_must_be_allowed() -> None:
    catalog = dataclasses.replace(CATALOG, aliases=GLOBAL)
    policy = dataclasses.replace(POLICY, aliases=ModelAliases.of({"gpt-4o*": SMALL.model}))
    plan = _plan("gpt-4o-2024-08-06", policy=policy, catalog=catalog)
    assert plan.deployments == (SMALL.model,) and plan.alias == f"gpt-4o* → {SMALL.model}"
    closed = dataclasses.replace(POLICY, allowed_tiers=frozenset({Tier.SMALL}))
    with pytest.raises(ModelNotAllowed):
        _plan("gpt-4o-2024-08-06", policy=closed, catalog=catalog)


def test_rules_file_aliases_and_model_conditions() -> None:
    rules = parse_rules(
        f"""
aliases:
  gpt-4.1: large
rules:
  - id: openai-apps
    when: {{model: gpt-4.1}}
    then: {{deployment: {LARGE.model}, max_tokens: 10}}
""",
        catalog=CATALOG,
    )
    plan = decide(
        requested_model="gpt-4.1",
        features=FEATURES,
        max_tokens=64,
        policy=POLICY,
        catalog=CATALOG,
        signals=Signals(),
        classifier=None,
        rules=rules,
    )
    assert plan.rule == "rule:openai-apps" and plan.deployments[0] == LARGE.model
    assert plan.alias == "gpt-4.1 → large" and plan.max_tokens == 10


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("aliases: {gpt-4.1: nowhere}", "not 'auto', a tier or a deployment id"),
        ("aliases: {small: large}", "already a model id"),
        (f"aliases: {{{SMALL.model}: large}}", "already a model id"),
        ("aliases: {'has space': large}", "letters, digits"),
    ],
)
def test_bad_aliases_in_a_rules_file(text: str, problem: str) -> None:
    with pytest.raises(RulesInvalid, match=problem) as exc:
        parse_rules(text, catalog=CATALOG)
    assert exc.value.line == 1


def test_alias_problem_in_settings_terms() -> None:
    names = {"auto", "small", "large", "external", SMALL.model}
    assert alias_problem("gpt-4o*", "large", reserved=names, targets=names) is None
    assert alias_problem("auto", "large", reserved=names, targets=names) is not None
