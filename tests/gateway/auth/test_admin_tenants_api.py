"""``/v1/admin/tenants`` on the admin app against real services (SQLite, the test Redis): the
bodies' schemas and their refusals, ``null`` putting a setting back to its default, and the
config-file tenants shown with what they are held to."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.auth.tenant_changes import TenantChanges
from gateway.auth.tenants import TenantProfile
from gateway.settings import Settings, load_settings
from tests.gateway.auth.conftest import ADMIN, EXAMPLE

SMALL = "llama-3.1-8b-instruct"
LARGE = "llama-3.1-70b-instruct-awq"
DEV_KEYS = ("dev-acme", "dev-globex", "dev-admin", "dev-finance")


@pytest.fixture
def settings(tmp_path: Path, redis_url: str, key_prefix: str) -> Settings:
    """The example config, with acme held to a weight, rate limits, budgets and a model list."""
    acme = {
        "key_env": "TIERGATE_KEY_ACME",
        "dev_key": "dev-acme",
        "allowed_tiers": ["small", "large"],
        "allowed_models": [SMALL],
        "priority": "interactive",
        "weight": 3,
        "requests_per_minute": 120,
        "tokens_per_minute": 50000,
        "budgets": [{"name": "monthly", "limit_usd": "500"}],
    }
    globex = {"key_env": "TIERGATE_KEY_GLOBEX", "dev_key": "dev-globex", "threshold": 0.35}
    return load_settings(
        EXAMPLE,
        redis={"url": redis_url, "key_prefix": key_prefix},
        database={"url": f"sqlite+aiosqlite:///{tmp_path / 'tiergate.db'}"},
        simulators=[],
        tenants={"acme": acme, "globex": globex},
    )


async def _create(client: httpx.AsyncClient, name: str, **settings: Any) -> dict[str, Any]:
    created = await client.post("/v1/admin/tenants", json={"name": name, **settings}, headers=ADMIN)
    assert created.status_code == 201, created.text
    return dict(created.json())


BAD_PATCHES: list[tuple[object, str | None, str]] = [
    # body, param, in the message
    ({"colour": "red"}, "colour", "body.colour: unknown field"),
    ({"name": "renamed"}, "name", "unknown field"),
    ({"weight": 2, "colour": None}, "colour", "unknown field"),  # null is no way round it
    ({"weight": "heavy"}, "weight", "valid number"),
    ({"weight": 0}, "weight", "greater than 0"),
    ({"requests_per_minute": 1.5}, "requests_per_minute", "integer"),
    ({"threshold": 1.5}, "threshold", "less than or equal to 1"),
    ({"allowed_tiers": "small"}, "allowed_tiers", "tuple"),
    ({"allowed_tiers": ["huge"]}, "allowed_tiers.0", "'small', 'large' or 'external'"),
    ({"priority": "urgent"}, "priority", "interactive"),
    ({"log_prompts": "maybe"}, "log_prompts", "boolean"),
    ({"budgets": {"name": "m"}}, "budgets", "tuple"),
    ({"budgets": [{"name": "m", "limit_usd": "1", "colour": "red"}]}, "budgets.0.colour", ""),
    ({"budgets": [{"name": "m"}]}, "budgets.0.limit_usd", "Field required"),
    ({"monthly_budget_usd": "lots"}, "monthly_budget_usd", "decimal"),
    ([{"weight": 2}], None, "valid dictionary"),
]


@pytest.mark.parametrize(("body", "param", "says"), BAD_PATCHES)
async def test_bad_patch_bodies_are_refused_naming_the_field(
    admin_client: httpx.AsyncClient, body: object, param: str | None, says: str
) -> None:
    before = await _create(admin_client, "umbrella", weight=2)
    response = await admin_client.patch("/v1/admin/tenants/umbrella", json=body, headers=ADMIN)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "invalid_request",
        param,
    )
    assert says in error["message"]
    after = await admin_client.get("/v1/admin/tenants/umbrella", headers=ADMIN)
    assert after.json() == before  # nothing changed


async def test_bad_create_bodies_and_bad_json_are_refused(admin_client: httpx.AsyncClient) -> None:
    cases: list[tuple[dict[str, Any], str | None]] = [
        ({"name": "x", "colour": "red"}, "colour"),
        ({"name": "x", "weight": "heavy"}, "weight"),
        ({"weight": 2}, "name"),
    ]
    for body, param in cases:
        response = await admin_client.post("/v1/admin/tenants", json=body, headers=ADMIN)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param
    for method, path in (("post", "/v1/admin/tenants"), ("patch", "/v1/admin/tenants/acme")):
        broken = await admin_client.request(
            method,
            path,
            content=b'{"weight": ',
            headers={**ADMIN, "content-type": "application/json"},
        )
        assert broken.status_code == 400, broken.text
        assert broken.json()["error"]["code"] == "invalid_json"
    listed = await admin_client.get("/v1/admin/tenants", headers=ADMIN)
    assert {t["source"] for t in listed.json()["data"]} == {"config"}  # none was made


async def test_what_worked_before_still_does(admin_client: httpx.AsyncClient) -> None:
    """Values as every client sent them: strings for money and numbers, lists for tuples."""
    await _create(admin_client, "umbrella", monthly_budget_usd="50", threshold="0.4")
    patched = await admin_client.patch(
        "/v1/admin/tenants/umbrella",
        json={
            "budgets": [{"name": "tiny", "limit_usd": 1, "window": "7d", "mode": "soft"}],
            "weight": "2.5",
            "allowed_tiers": ["small"],
            "allowed_models": [SMALL],
            "requests_per_minute": 60,
        },
        headers=ADMIN,
    )
    assert patched.status_code == 200, patched.text
    shown = patched.json()
    assert (shown["weight"], shown["threshold"], shown["monthly_budget_usd"]) == (2.5, 0.4, "50")
    assert [b["name"] for b in shown["budgets"]] == ["tiny"]
    assert (await admin_client.patch("/v1/admin/tenants/umbrella", json={}, headers=ADMIN)).json()[
        "weight"
    ] == 2.5  # an empty change changes nothing


async def test_null_puts_each_setting_back_to_its_default(admin_client: httpx.AsyncClient) -> None:
    await _create(
        admin_client,
        "umbrella",
        default_tier="large",
        allowed_tiers=["large"],
        allowed_models=[LARGE],
        threshold=0.2,
        baseline_model=SMALL,
        priority="batch",
        weight=4,
        requests_per_minute=10,
        tokens_per_minute=1000,
        budgets=[{"name": "weekly", "limit_usd": "5", "window": "7d"}],
        monthly_budget_usd="20",
        log_prompts=True,
    )
    everything = dict.fromkeys(TenantChanges.model_fields)
    cleared = await admin_client.patch("/v1/admin/tenants/umbrella", json=everything, headers=ADMIN)
    assert cleared.status_code == 200, cleared.text
    shown = cleared.json()
    defaults = TenantProfile().model_dump(mode="json")
    assert {k: shown[k] for k in defaults} == defaults
    assert shown["effective"]["weight"] == 1.0 and shown["effective"]["budgets"] == []
    assert shown["effective"]["baseline_model"] == LARGE  # the default deployment again
    again = await admin_client.get("/v1/admin/tenants/umbrella", headers=ADMIN)
    assert again.json() == shown

    # [] is a value, not a clearing, where it means something else than unset
    narrowed = await admin_client.patch(
        "/v1/admin/tenants/umbrella", json={"allowed_models": []}, headers=ADMIN
    )
    assert narrowed.json()["allowed_models"] == []
    widened = await admin_client.patch(
        "/v1/admin/tenants/umbrella", json={"allowed_models": None}, headers=ADMIN
    )
    assert widened.json()["allowed_models"] is None


async def test_openapi_publishes_the_bodies(admin_client: httpx.AsyncClient) -> None:
    response = await admin_client.get("/openapi.json")  # no key, as /metrics
    assert response.status_code == 200
    schema = response.json()
    paths = schema["paths"]
    body_of = {
        "patch": paths["/v1/admin/tenants/{name}"]["patch"],
        "post": paths["/v1/admin/tenants"]["post"],
    }
    refs = {
        m: op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        for m, op in body_of.items()
    }
    assert refs == {
        "patch": "#/components/schemas/TenantChanges",
        "post": "#/components/schemas/TenantCreate",
    }
    assert '"422"' not in json.dumps(schema)  # refusals are 400s with the error body
    assert body_of["patch"]["responses"]["409"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorResponse"
    }
    components = schema["components"]["schemas"]
    changes = components["TenantChanges"]
    assert changes["additionalProperties"] is False and "required" not in changes
    assert list(changes["properties"]) == list(TenantProfile.model_fields)
    weight = changes["properties"]["weight"]
    assert {"type": "null"} in weight["anyOf"] and "null: 1" in weight["description"]
    create = components["TenantCreate"]
    assert create["additionalProperties"] is False and create["required"] == ["name"]


async def test_config_tenants_show_what_they_are_held_to(admin_client: httpx.AsyncClient) -> None:
    await _create(admin_client, "umbrella", weight=2, monthly_budget_usd="9")
    response = await admin_client.get("/v1/admin/tenants", headers=ADMIN)
    assert response.status_code == 200
    listed = {t["name"]: t for t in response.json()["data"]}
    assert [t["source"] for t in response.json()["data"]] == ["config", "config", "runtime"]

    acme = listed["acme"]
    assert (acme["weight"], acme["requests_per_minute"], acme["tokens_per_minute"]) == (
        3.0,
        120,
        50000,
    )
    assert acme["baseline_model"] is None and acme["threshold"] is None  # as written: unset
    assert acme["effective"] == {
        "default_tier": "small",
        "allowed_tiers": ["small", "large"],
        "allowed_models": [SMALL],
        "threshold": acme["effective"]["threshold"],  # the classifier's calibrated default
        "priority": "interactive",
        "weight": 3.0,
        "requests_per_minute": 120,
        "tokens_per_minute": 50000,
        "budgets": [
            {
                "name": "monthly",
                "limit_usd": "500",
                "window": "month",
                "mode": "hard",
                "app": None,
                "tag": None,
                "alert_at": [0.5, 0.8, 1.0],
                "webhook_url_env": None,
            }
        ],
        "baseline_model": LARGE,
        "log_prompts": False,
    }
    assert 0 < acme["effective"]["threshold"] < 1
    globex = listed["globex"]["effective"]
    assert globex["threshold"] == 0.35 and globex["weight"] == 1.0
    assert globex["requests_per_minute"] is None and globex["budgets"] == []
    # a run-time tenant's: the same shape, its monthly_budget_usd folded into its budgets
    umbrella = listed["umbrella"]["effective"]
    assert set(umbrella) == set(acme["effective"])
    assert umbrella["weight"] == 2.0 and [b["name"] for b in umbrella["budgets"]] == ["monthly"]

    # never a key, its variable or a hash
    text = response.text
    for secret in (*DEV_KEYS, "key_env", "dev_key", "TIERGATE_KEY", "digest", "salt"):
        assert secret not in text, secret

    one = await admin_client.get("/v1/admin/tenants/acme", headers=ADMIN)
    assert one.status_code == 200 and one.json() == acme
    for method in ("patch", "delete"):
        refused = await admin_client.request(
            method, "/v1/admin/tenants/acme", json={"weight": 1}, headers=ADMIN
        )
        assert refused.status_code == 409, refused.text
        assert "config file" in refused.json()["error"]["message"]


async def test_effective_follows_a_change(admin_client: httpx.AsyncClient) -> None:
    await _create(admin_client, "umbrella", requests_per_minute=5)
    patched = await admin_client.patch(
        "/v1/admin/tenants/umbrella", json={"requests_per_minute": 600}, headers=ADMIN
    )
    assert patched.json()["effective"]["requests_per_minute"] == 600
    listed = await admin_client.get("/v1/admin/tenants", headers=ADMIN)
    (umbrella,) = [t for t in listed.json()["data"] if t["name"] == "umbrella"]
    assert umbrella["effective"]["requests_per_minute"] == 600


async def test_no_tenant_key_sees_any_tenant(admin_client: httpx.AsyncClient) -> None:
    await _create(admin_client, "umbrella")
    for key in ("dev-acme", "dev-globex", "dev-finance"):
        headers = {"authorization": f"Bearer {key}"}
        for path in ("/v1/admin/tenants", "/v1/admin/tenants/acme", "/v1/admin/tenants/globex"):
            response = await admin_client.get(path, headers=headers)
            assert response.status_code == 403, (key, path)
            assert "weight" not in response.text and "umbrella" not in response.text
        patched = await admin_client.patch(
            "/v1/admin/tenants/umbrella", json={"colour": 1}, headers=headers
        )
        assert patched.status_code == 403  # refused before the body is looked at
        assert "colour" not in json.dumps(patched.json())
