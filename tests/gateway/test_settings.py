from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.settings import load_settings

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "config.example.yaml"


def test_example_config_loads() -> None:
    settings = load_settings(EXAMPLE)
    assert set(settings.tenants) == {"acme", "globex", "initech"}
    assert {d.model for d in settings.deployments} == {
        "llama-3.1-8b-instruct",
        "llama-3.1-70b-instruct-awq",
        "gpt-4o-mini",
    }
    assert [s.port for s in settings.simulators] == [8101, 8102, 8103]
    assert settings.server.admin_port == 9464


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
