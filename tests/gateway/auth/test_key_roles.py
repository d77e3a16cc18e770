"""One tenant per key (issue 20): a key with ``tenant:acme`` and ``rules:globex`` acted as
globex (the alphabetically first tenant role). Such roles are refused wherever a key is made —
admin API, CLI, config file — and a key that has them anyway acts for no tenant."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from gateway.auth.principals import Principal, check_roles
from gateway.cli.main import app
from gateway.settings import load_settings
from tests.gateway.auth.conftest import ADMIN, EXAMPLE

TWO_TENANTS = [["tenant:acme", "rules:globex"], ["rules:acme", "rules:globex"],
               ["tenant:acme", "tenant:globex", "finance"]]  # fmt: skip
ONE_TENANT = [["tenant:acme", "rules:acme"], ["rules:acme"], ["admin", "tenant:acme"], ["finance"]]


@pytest.mark.parametrize("roles", TWO_TENANTS)
def test_roles_naming_two_tenants_are_refused(roles: list[str]) -> None:
    problem = check_roles(roles, tenant_name=bool)
    assert problem is not None and "one tenant" in problem and "acme, globex" in problem
    assert Principal("p", frozenset(roles)).tenant is None  # acts for none, never for globex


@pytest.mark.parametrize("roles", ONE_TENANT)
def test_roles_naming_one_tenant_are_fine(roles: list[str]) -> None:
    assert check_roles(roles, tenant_name=bool) is None
    tenant = Principal("p", frozenset(roles)).tenant
    assert tenant == ("acme" if roles != ["finance"] else None)


@pytest.mark.parametrize("roles", TWO_TENANTS)
async def test_the_admin_api_refuses_them(
    admin_client: httpx.AsyncClient, roles: list[str]
) -> None:
    made = await admin_client.post(
        "/v1/admin/keys", json={"principal": "p", "roles": roles}, headers=ADMIN
    )
    assert made.status_code == 400, made.text
    error = made.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_request", "roles")
    assert "one tenant" in error["message"]
    listed = await admin_client.get("/v1/admin/keys", headers=ADMIN)
    assert listed.json()["data"] == []


def test_the_cli_refuses_them(tmp_path: Path, redis_url: str, key_prefix: str) -> None:
    env = {
        "TIERGATE_DATABASE__URL": f"sqlite+aiosqlite:///{tmp_path / 'tiergate.db'}",
        "TIERGATE_REDIS__URL": redis_url,
        "TIERGATE_REDIS__KEY_PREFIX": key_prefix,
    }
    base = ["keys", "create", "--config", str(EXAMPLE), "--principal", "p"]
    runner = CliRunner()
    refused = runner.invoke(
        app, [*base, "--role", "tenant:acme", "--role", "rules:globex"], env=env
    )
    assert refused.exit_code == 1, refused.output
    assert "one tenant" in refused.output
    too_long = runner.invoke(
        app, [*base, "--role", "finance", "--expires-in", str(10**18)], env=env
    )
    assert too_long.exit_code == 2, too_long.output  # refused by the option, not a traceback
    made = runner.invoke(app, [*base, "--role", "tenant:acme", "--role", "rules:acme"], env=env)
    assert made.exit_code == 0, made.output
    assert sorted(json.loads(made.stdout.split("\nThe key")[0])["roles"]) == [
        "rules:acme", "tenant:acme"]  # fmt: skip


def test_the_config_file_refuses_them(tmp_path: Path) -> None:
    config = yaml.safe_load(EXAMPLE.read_text())
    config["principals"].append(
        {"name": "ci", "roles": ["tenant:acme", "rules:globex"], "key_env": "TIERGATE_CI_KEY"}
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ValidationError, match="one tenant"):
        load_settings(path)


@pytest.mark.parametrize(
    ("principal", "complaint"),
    [
        ({"name": "ci\n", "roles": ["finance"]}, "control character"),
        ({"name": "ci", "roles": ["root"]}, "unknown role"),
        ({"name": "ci", "roles": ["rules:a\x00"]}, "unknown role"),
    ],
)
def test_the_config_file_refuses_bad_principals(
    tmp_path: Path, principal: dict[str, object], complaint: str
) -> None:
    config = yaml.safe_load(EXAMPLE.read_text())
    config["principals"].append({**principal, "key_env": "TIERGATE_CI_KEY"})
    with pytest.raises(ValidationError, match=complaint):
        load_settings(None, **config)
