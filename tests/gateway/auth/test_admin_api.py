"""The admin API on the admin app, against real services (SQLite, the test Redis)."""

from __future__ import annotations

import httpx

from tests.gateway.auth.conftest import ADMIN


async def test_tenant_and_key_lifecycle(
    admin_client: httpx.AsyncClient, public_client: httpx.AsyncClient
) -> None:
    created = await admin_client.post(
        "/v1/admin/tenants",
        json={"name": "umbrella", "allowed_tiers": ["small"], "priority": "batch"},
        headers=ADMIN,
    )
    assert created.status_code == 201, created.text
    key = await admin_client.post(
        "/v1/admin/keys",
        json={"principal": "umbrella-app", "roles": ["tenant:umbrella"]},
        headers=ADMIN,
    )
    assert key.status_code == 201, key.text
    plain, key_id = key.json()["key"], key.json()["key_id"]

    models = await public_client.get("/v1/models", headers={"authorization": f"Bearer {plain}"})
    assert models.status_code == 200, models.text
    ids = {m["id"] for m in models.json()["data"]}
    assert "small" in ids and "large" not in ids  # the run-time tenant's own settings

    listed = await admin_client.get("/v1/admin/keys", headers=ADMIN)
    assert key_id in listed.text and plain not in listed.text
    assert plain.split("_", 2)[2] not in listed.text

    revoked = await admin_client.post(f"/v1/admin/keys/{key_id}/revoke", headers=ADMIN)
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    refused = await public_client.get("/v1/models", headers={"authorization": f"Bearer {plain}"})
    assert refused.status_code == 401
    assert plain not in refused.text
    assert refused.json()["error"]["code"] == "invalid_api_key"


async def test_rotation_returns_a_new_key_once(admin_client: httpx.AsyncClient) -> None:
    first = await admin_client.post(
        "/v1/admin/keys", json={"principal": "bot", "roles": ["finance"]}, headers=ADMIN
    )
    key_id = first.json()["key_id"]
    rotated = await admin_client.post(
        f"/v1/admin/keys/{key_id}/rotate", json={"overlap_s": 30}, headers=ADMIN
    )
    assert rotated.status_code == 201
    assert rotated.json()["key"] != first.json()["key"]
    old = (await admin_client.get(f"/v1/admin/keys/{key_id}", headers=ADMIN)).json()
    assert old["replaced_by"] == rotated.json()["key_id"] and old["expires_at"] is not None
    assert "key" not in old


async def test_refusals_are_openai_shaped(admin_client: httpx.AsyncClient) -> None:
    cases = [
        ("post", "/v1/admin/tenants", {"name": "acme"}, 409),  # a config-file tenant
        ("post", "/v1/admin/tenants", {"name": "x", "allowed_models": ["nope"]}, 400),
        ("post", "/v1/admin/tenants", {"name": "x", "colour": "red"}, 400),
        ("get", "/v1/admin/tenants/nobody", None, 404),
        ("post", "/v1/admin/keys", {"principal": "p", "roles": ["root"]}, 400),
        ("post", "/v1/admin/keys/000000000000/revoke", None, 404),
    ]
    for method, path, body, status in cases:
        response = await admin_client.request(method, path, json=body, headers=ADMIN)
        assert response.status_code == status, (path, response.text)
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


async def test_only_admins_manage(admin_client: httpx.AsyncClient) -> None:
    for key in ("dev-acme", "dev-finance"):
        headers = {"authorization": f"Bearer {key}"}
        assert (await admin_client.get("/v1/admin/keys", headers=headers)).status_code == 403
        made = await admin_client.post(
            "/v1/admin/keys", json={"principal": "p", "roles": ["admin"]}, headers=headers
        )
        assert made.status_code == 403
    assert (await admin_client.get("/v1/admin/tenants")).status_code == 401
