"""Planning an embeddings request: one embedding deployment, tenant access as for chat."""

from __future__ import annotations

import pytest

from router.aliases import ModelAliases
from router.catalog import Catalog, DeploymentSpec, Signals, TenantPolicy, Tier
from router.embeddings import plan_embedding
from router.errors import ModelNotAllowed, UnknownModel

SMALL_EMBED = DeploymentSpec("bge-m3", Tier.SMALL, 8192)
LARGE_EMBED = DeploymentSpec("e5-mistral", Tier.LARGE, 4096)
EMBEDDINGS = Catalog(
    (SMALL_EMBED, LARGE_EMBED),
    aliases=ModelAliases.of({"text-embedding-3-small": "bge-m3", "gpt-4o": "large"}),
)


def test_a_named_deployment_alone() -> None:
    plan = plan_embedding("e5-mistral", TenantPolicy("acme"), EMBEDDINGS)
    assert (plan.deployments, plan.tier, plan.rule) == (("e5-mistral",), Tier.LARGE, "pin:model")


def test_auto_takes_the_first_the_tenant_may_use() -> None:
    assert plan_embedding("auto", TenantPolicy("a"), EMBEDDINGS).deployments == ("bge-m3",)
    large_only = TenantPolicy("b", allowed_tiers=frozenset({Tier.LARGE}))
    assert plan_embedding("auto", large_only, EMBEDDINGS).deployments == ("e5-mistral",)
    nothing = TenantPolicy("c", allowed_models=frozenset({"llama"}))
    with pytest.raises(ModelNotAllowed):
        plan_embedding("auto", nothing, EMBEDDINGS)


def test_an_alias_to_an_embedding_deployment() -> None:
    plan = plan_embedding("text-embedding-3-small", TenantPolicy("acme"), EMBEDDINGS)
    assert plan.deployments == ("bge-m3",) and plan.alias == "text-embedding-3-small → bge-m3"
    own = TenantPolicy("x", aliases=ModelAliases.of({"text-embedding-3-small": "e5-mistral"}))
    assert plan_embedding("text-embedding-3-small", own, EMBEDDINGS).deployments == ("e5-mistral",)


@pytest.mark.parametrize("model", ["gpt-4o", "llama-3.1-8b-instruct", "small"])
def test_anything_else_is_unknown(model: str) -> None:
    with pytest.raises(UnknownModel, match="not an embedding model"):
        plan_embedding(model, TenantPolicy("acme"), EMBEDDINGS)


@pytest.mark.parametrize(
    "policy",
    [
        TenantPolicy("t", allowed_tiers=frozenset({Tier.SMALL})),
        TenantPolicy("t", allowed_models=frozenset({"bge-m3"})),
    ],
)
def test_tenant_access(policy: TenantPolicy) -> None:
    with pytest.raises(ModelNotAllowed):
        plan_embedding("e5-mistral", policy, EMBEDDINGS)


def test_an_open_breaker_is_said() -> None:
    signals = Signals(unavailable=frozenset({"bge-m3"}))
    plan = plan_embedding("bge-m3", TenantPolicy("acme"), EMBEDDINGS, signals)
    assert plan.deployments == ("bge-m3",) and "unavailable" in plan.reason
