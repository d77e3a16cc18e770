from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from gateway.services import build_catalog
from gateway.settings import Settings, TimeoutSettings, load_settings
from router.capabilities import Capability
from router.catalog import Tier

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "config.example.yaml"


def test_example_config_loads() -> None:
    settings = load_settings(EXAMPLE)
    assert set(settings.tenants) == {"acme", "globex", "initech"}
    assert {d.model for d in settings.deployments} == {
        "llama-3.1-8b-instruct",
        "llama-3.1-70b-instruct-awq",
        "gpt-4o-mini",
        "bge-m3",
    }
    assert settings.deployment("bge-m3").kind == "embedding"  # type: ignore[union-attr]
    assert [s.port for s in settings.simulators] == [8101, 8102, 8103, 8104]
    assert settings.server.admin_port == 9464
    assert settings.fallback.replica_eject_after == 3
    assert (settings.fallback.replica_eject_s, settings.fallback.replica_eject_max_s) == (10, 300)


def test_environment_wins_over_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERGATE_REDIS__URL", "redis://example.invalid:6379/3")
    monkeypatch.setenv("TIERGATE_SERVER__PORT", "9999")
    settings = load_settings(EXAMPLE)
    assert settings.redis.url == "redis://example.invalid:6379/3"
    assert settings.server.port == 9999


@pytest.mark.parametrize(
    "yaml_text",
    [
        "servr: {port: 1}\n",  # unknown top-level key
        "server: {prot: 1}\n",  # unknown nested key
        "tenants: {a: {key_env: K, threshold: 2}}\n",  # out of range
        "deployments: [{model: auto, tier: small, replicas: [{url: 'http://x'}]}]\n",  # reserved id
        "deployments: [{model: m, tier: small}]\n",  # vllm without replicas
        "tenants: {a: {key_env: K, baseline_model: nope}}\n",  # unknown reference
        "redis: {command_timeout_s: 0}\n",  # a bound of nothing
        "deployments: [{model: m, tier: small, replicas: [{url: 'http://x'}],"
        " capabilities: {vison: true}}]\n",  # a misspelt capability
        "deployments: [{model: m, tier: small, replicas: [{url: 'http://x'}],"
        " capabilities: {vision: maybe}}]\n",  # not a boolean
        "fallback: {replica_eject_after: -1}\n",  # a count below nothing
        "fallback: {replica_eject_s: 0}\n",  # a cool-down of nothing
    ],
)
def test_bad_config_is_rejected(tmp_path: Path, yaml_text: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ValidationError):
        load_settings(path)


def test_tracing_is_off_in_the_example_and_set_by_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings(EXAMPLE).tracing.enabled is False
    monkeypatch.setenv("TIERGATE_TRACING__ENABLED", "true")
    monkeypatch.setenv("TIERGATE_TRACING__ENDPOINT", "http://otel-collector:4318")
    monkeypatch.setenv("TIERGATE_TRACING__SAMPLE_RATIO", "0.25")
    monkeypatch.setenv("TIERGATE_TRACING__HEADERS_ENV", '{"authorization": "OTLP_AUTH"}')
    tracing = load_settings(EXAMPLE).tracing
    assert tracing.enabled is True
    assert tracing.endpoint == "http://otel-collector:4318"
    assert tracing.sample_ratio == 0.25
    assert tracing.headers_env == {"authorization": "OTLP_AUTH"}


@pytest.mark.parametrize(
    "yaml_text",
    [
        "tracing: {sample_ratio: 1.5}\n",
        "tracing: {headers: {authorization: Bearer x}}\n",  # values only by env reference
    ],
)
def test_bad_tracing_config_is_rejected(tmp_path: Path, yaml_text: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ValidationError):
        load_settings(path)


def test_capabilities_of_the_example_and_their_defaults(tmp_path: Path) -> None:
    """The example's Llama deployments are text only, gpt-4o-mini reads images; a deployment
    that says nothing serves tools and JSON schemas (docs/rules.md#capabilities)."""
    catalog = build_catalog(load_settings(EXAMPLE))
    text_only = frozenset({Capability.TOOLS, Capability.JSON_SCHEMA})
    assert {d.model: d.capabilities for d in catalog.deployments} == {
        "llama-3.1-8b-instruct": text_only,
        "llama-3.1-70b-instruct-awq": text_only,
        "gpt-4o-mini": text_only | {Capability.VISION},
    }
    path = tmp_path / "c.yaml"
    path.write_text(
        "deployments:\n"
        "  - {model: a, tier: small, replicas: [{url: 'http://x'}]}\n"
        "  - {model: b, tier: large, replicas: [{url: 'http://y'}],\n"
        "     capabilities: {tools: false, json_schema: false, reasoning: true}}\n"
    )
    a, b = build_catalog(load_settings(path)).deployments
    assert a.capabilities == text_only
    assert b.capabilities == frozenset({Capability.REASONING})


def test_an_embedding_deployment_is_vllm_and_never_a_baseline() -> None:
    base = yaml.safe_load(EXAMPLE.read_text())
    litellm = next(d for d in base["deployments"] if d["model"] == "gpt-4o-mini")
    with pytest.raises(ValidationError, match="an embedding deployment is served by vllm"):
        Settings.model_validate({**base, "deployments": [{**litellm, "kind": "embedding"}]})
    base["tenants"]["acme"]["baseline_model"] = "bge-m3"
    with pytest.raises(ValidationError, match="baseline_model must be a chat deployment"):
        Settings.model_validate(base)


@pytest.mark.parametrize(
    "fallbacks",
    [["nope"], ["m"], ["n", "n"]],
    ids=["unknown", "itself", "twice"],
)
def test_bad_fallback_chains_are_rejected(tmp_path: Path, fallbacks: list[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "deployments:\n"
        f"  - {{model: m, tier: small, replicas: [{{url: 'http://x'}}], fallbacks: {fallbacks}}}\n"
        "  - {model: n, tier: large, replicas: [{url: 'http://y'}]}\n"
    )
    with pytest.raises(ValidationError):
        load_settings(path)


def test_fallback_chains_and_continuation_reach_the_catalog(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "deployments:\n"
        "  - {model: m, tier: small, replicas: [{url: 'http://x'}], fallbacks: [n],\n"
        "     accepts_continuation: false}\n"
        "  - {model: n, tier: large, replicas: [{url: 'http://y'}]}\n"
        "  - {model: h, tier: external, provider: litellm}\n"
    )
    catalog = build_catalog(load_settings(path))
    m, n, h = (catalog.get(name) for name in "mnh")
    assert m is not None and n is not None and h is not None
    assert m.fallbacks == ("n",) and n.fallbacks == ()
    assert (m.continues, n.continues, h.continues) == (False, True, False)


def test_the_shipped_first_token_limits_leave_the_client_time_to_fall_back() -> None:
    """A first-token limit at the common client read timeouts (10-15 s) would leave a silent
    deployment only when the client has given up; the example's and the default are shorter,
    and non-streamed calls have a first-byte limit shorter than their attempt."""
    settings = load_settings(EXAMPLE)
    for tier in Tier:
        timeouts = settings.fallback.for_tier(tier).timeouts
        assert timeouts.first_token_s <= 10
        assert timeouts.first_byte_s < timeouts.attempt_s
    assert settings.fallback.for_tier(Tier.SMALL).timeouts.first_token_s <= 5
    assert TimeoutSettings().first_token_s < 10
    assert 0 < settings.fallback.attempt_share < 1
