"""``/v1/admin/tenants`` on the admin app against real services (SQLite, the test Redis): the
bodies' schemas and their refusals, and ``null`` putting a setting back to its default."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from gateway.auth.tenant_changes import TenantChanges
from gateway.auth.tenants import TenantProfile
from tests.gateway.auth.conftest import ADMIN

SMALL = "llama-3.1-8b-instruct"
LARGE = "llama-3.1-70b-instruct-awq"


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
    components = schema["components"]["schemas"]
    changes = components["TenantChanges"]
    assert changes["additionalProperties"] is False and "required" not in changes
    assert list(changes["properties"]) == list(TenantProfile.model_fields)
    weight = changes["properties"]["weight"]
    assert {"type": "null"} in weight["anyOf"] and "null: 1" in weight["description"]
    create = components["TenantCreate"]
    assert create["additionalProperties"] is False and create["required"] == ["name"]


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
