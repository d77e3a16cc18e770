"""``tiergate tenants create|update`` with the rate-limit, weight, baseline and budget flags,
on a real SQLite store and the test Redis."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gateway.auth.tenants import TenantProfile
from gateway.cli.main import app
from tests.gateway.auth.conftest import EXAMPLE

LARGE = "llama-3.1-70b-instruct-awq"


@pytest.fixture
def env(tmp_path: Path, redis_url: str, key_prefix: str) -> dict[str, str]:
    return {
        "TIERGATE_DATABASE__URL": f"sqlite+aiosqlite:///{tmp_path / 'tiergate.db'}",
        "TIERGATE_REDIS__URL": redis_url,
        "TIERGATE_REDIS__KEY_PREFIX": key_prefix,
    }


def test_create_and_update_with_limits_budgets_and_baseline(env: dict[str, str]) -> None:
    runner = CliRunner()
    created = runner.invoke(
        app,
        [
            *("tenants", "create", "umbrella", "--config", str(EXAMPLE)),
            *("--weight", "2", "--requests-per-minute", "60", "--tokens-per-minute", "9000"),
            *("--baseline-model", LARGE, "--budget-usd", "100"),
            *("--budget", '{name: weekly, limit_usd: "25", window: 7d, mode: soft, app: bot}'),
            *("--budget", "{name: eu, limit_usd: 5, tag: eu}"),
        ],
        env=env,
    )
    assert created.exit_code == 0, created.output
    shown = json.loads(created.output)
    assert (shown["weight"], shown["requests_per_minute"], shown["tokens_per_minute"]) == (
        2.0,
        60,
        9000,
    )
    assert shown["baseline_model"] == LARGE and shown["monthly_budget_usd"] == "100"
    assert [(b["name"], b["mode"], b["app"], b["tag"]) for b in shown["budgets"]] == [
        ("weekly", "soft", "bot", None),
        ("eu", "hard", None, "eu"),
    ]

    updated = runner.invoke(
        app,
        ["tenants", "update", "umbrella", "--config", str(EXAMPLE), "--requests-per-minute", "120"],
        env=env,
    )
    assert updated.exit_code == 0, updated.output
    after = json.loads(updated.output)
    assert after["requests_per_minute"] == 120 and after["budgets"] == shown["budgets"]


@pytest.mark.parametrize(
    ("flags", "complaint"),
    [
        (["--baseline-model", "gpt-9"], "baseline_model: unknown deployment 'gpt-9'"),
        (["--allowed-models", "nope"], "allowed_models: unknown deployments ['nope']"),
        (["--budget", "monthly"], "--budget takes a mapping"),
        (["--budget", "{name: m}"], "limit_usd"),
        (["--weight", "0"], "weight"),
    ],
)
def test_bad_flags_are_refused(env: dict[str, str], flags: list[str], complaint: str) -> None:
    result = CliRunner().invoke(
        app, ["tenants", "create", "umbrella", "--config", str(EXAMPLE), *flags], env=env
    )
    assert result.exit_code == 2, result.output
    assert complaint in result.output


def test_update_clears_settings_back_to_their_defaults(env: dict[str, str]) -> None:
    runner = CliRunner()
    base = ["--config", str(EXAMPLE)]
    created = runner.invoke(
        app,
        [
            *("tenants", "create", "umbrella", *base),
            *("--weight", "2", "--requests-per-minute", "60", "--threshold", "0.3"),
            *("--baseline-model", LARGE, "--budget-usd", "100", "--priority", "batch"),
            *("--allowed-models", LARGE, "--budget", "{name: eu, limit_usd: 5, tag: eu}"),
        ],
        env=env,
    )
    assert created.exit_code == 0, created.output
    cleared = runner.invoke(
        app,
        [
            *("tenants", "update", "umbrella", *base, "--tokens-per-minute", "900"),
            *("--clear", "weight", "--clear", "budgets", "--clear", "requests-per-minute"),
            *("--clear", "budget-usd", "--clear", "baseline_model", "--clear", "priority"),
            *("--clear", "allowed_models"),
        ],
        env=env,
    )
    assert cleared.exit_code == 0, cleared.output
    shown = runner.invoke(app, ["tenants", "show", "umbrella", *base], env=env)
    assert shown.exit_code == 0, shown.output
    after = json.loads(shown.output)
    assert after == json.loads(cleared.output)
    defaults = TenantProfile()
    assert (after["weight"], after["budgets"], after["requests_per_minute"]) == (
        defaults.weight,
        [],
        None,
    )
    assert after["monthly_budget_usd"] is None and after["baseline_model"] is None
    assert after["priority"] == defaults.priority and after["allowed_models"] is None
    assert (after["threshold"], after["tokens_per_minute"]) == (0.3, 900)  # kept, and set


@pytest.mark.parametrize(
    ("flags", "complaint"),
    [
        (["--clear", "colour"], "--clear: unknown setting 'colour'"),
        (["--clear", "weight", "--weight", "3"], "weight is both set and cleared"),
        (["--clear", "budget", "--budget", "{name: m, limit_usd: 1}"], "budgets is both set"),
        (["--priority", "urgent"], "invalid tenant settings: priority"),
        (["--baseline-model", "gpt-9"], "baseline_model: unknown deployment 'gpt-9'"),
    ],
)
def test_bad_updates_are_refused(env: dict[str, str], flags: list[str], complaint: str) -> None:
    runner = CliRunner()
    base = ["--config", str(EXAMPLE)]
    made = runner.invoke(app, ["tenants", "create", "umbrella", *base, "--weight", "2"], env=env)
    assert made.exit_code == 0, made.output
    result = runner.invoke(app, ["tenants", "update", "umbrella", *base, *flags], env=env)
    assert result.exit_code == 2, result.output
    assert complaint in result.output
    shown = runner.invoke(app, ["tenants", "show", "umbrella", *base], env=env)
    assert json.loads(shown.output)["weight"] == 2.0


def test_list_and_show_cover_config_file_tenants_without_their_keys(
    env: dict[str, str], tmp_path: Path
) -> None:
    runner = CliRunner()
    base = ["--config", str(EXAMPLE)]
    for name in ("umbrella", "hooli"):
        made = runner.invoke(app, ["tenants", "create", name, *base], env=env)
        assert made.exit_code == 0, made.output
    # A config file that later names one of them: its entry wins over the row.
    later = yaml.safe_load(EXAMPLE.read_text())
    later["tenants"]["hooli"] = {"key_env": "TIERGATE_KEY_HOOLI", "weight": 3}
    config = tmp_path / "later.yaml"
    config.write_text(yaml.safe_dump(later))

    listed = runner.invoke(app, ["tenants", "list", "--config", str(config)], env=env)
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.output)
    from_config = {r["name"]: r for r in rows if r["source"] == "config"}
    assert set(from_config) == set(later["tenants"])
    assert from_config["hooli"]["weight"] == 3
    runtime = {r["name"]: r for r in rows if r["source"] == "runtime"}
    assert set(runtime) == {"umbrella", "hooli"}
    assert runtime["hooli"].get("shadowed_by_config") is True
    assert "shadowed_by_config" not in runtime["umbrella"]
    assert "key_env" not in listed.output and "dev_key" not in listed.output
    assert "dev-acme" not in listed.output

    shown = runner.invoke(app, ["tenants", "show", "acme", *base], env=env)
    assert shown.exit_code == 0, shown.output
    acme = json.loads(shown.output)
    assert acme["source"] == "config" and "effective" not in acme
    assert acme == from_config["acme"]
    umbrella = runner.invoke(app, ["tenants", "show", "umbrella", *base], env=env)
    assert json.loads(umbrella.output)["source"] == "runtime"
