"""The authorization matrix: for every route of both apps and every kind of principal, the
outcome — allowed (anything but 401/403) or the refusal — checked with real requests against
real services.

The routes come from the apps themselves: a route that declares no roles fails
(``test_every_route_is_guarded``), a route missing from ``POLICY`` is checked against what its
declaration implies (anonymous and bad keys refused, undeclared roles refused), and a route in
``POLICY`` must give exactly the pinned outcome, so a loosened declaration fails too.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from fastapi import FastAPI

from gateway.api.access import ADMIN, AUTHENTICATED, FINANCE, PUBLIC, RULES, TENANT
from gateway.app import create_admin_app, create_app
from gateway.auth.admin import AuthAdmin
from gateway.services import Services
from tests.gateway.api.test_access import _guards, _routes

KINDS = ("anonymous", "invalid", "revoked", "tenant", "rules", "finance", "admin")
OK, UNAUTH, DENIED = "ok", 401, 403

# What each declared role lets through, written independently of gateway.api.access.
ORACLE: dict[str, set[str]] = {
    PUBLIC: set(KINDS),
    AUTHENTICATED: {"tenant", "rules", "finance", "admin"},
    TENANT: {"tenant", "rules", "admin"},
    RULES: {"rules", "admin"},
    FINANCE: {"finance", "admin"},
    ADMIN: {"admin"},
}


def _row(ok: set[str], refused: int = DENIED) -> dict[str, object]:
    return {
        k: OK if k in ok else (UNAUTH if k in ("anonymous", "invalid", "revoked") else refused)
        for k in KINDS
    }


EVERYONE = {"anonymous", "invalid", "revoked", "tenant", "rules", "finance", "admin"}
CALLERS = {"tenant", "rules"}  # principals acting for a tenant
READERS = {"tenant", "rules", "admin"}
RULE_READERS = {"tenant", "rules", "finance", "admin"}  # finance reads every tenant's rules
WRITERS = {"rules", "admin"}

POLICY: dict[tuple[str, str, str], dict[str, object]] = {
    ("public", "POST", "/v1/chat/completions"): _row(CALLERS),
    ("public", "POST", "/v1/completions"): _row(CALLERS),
    ("public", "POST", "/v1/responses"): _row(CALLERS),
    ("public", "POST", "/v1/embeddings"): _row(CALLERS),
    ("public", "GET", "/v1/models"): _row(CALLERS),
    ("public", "GET", "/v1/reports/costs"): _row({"tenant", "rules", "finance", "admin"}),
    ("public", "POST", "/v1/route/explain"): _row(READERS),
    ("public", "GET", "/v1/rules"): _row(RULE_READERS),
    ("public", "GET", "/v1/rules/{tenant}"): _row(RULE_READERS),
    ("public", "PUT", "/v1/rules/{tenant}"): _row(WRITERS),
    ("public", "POST", "/v1/rules/{tenant}/validate"): _row(WRITERS),
    ("public", "DELETE", "/v1/rules/{tenant}"): _row(WRITERS),
    ("public", "GET", "/v1/rules/{tenant}/versions"): _row(RULE_READERS),
    ("public", "GET", "/v1/rules/{tenant}/versions/{version}"): _row(RULE_READERS),
    ("public", "POST", "/v1/rules/{tenant}/rollback"): _row(WRITERS),
    ("public", "GET", "/v1/rules/{tenant}/figures"): _row(RULE_READERS),
    ("public", "POST", "/v1/rules/{tenant}/explain"): _row(RULE_READERS),
    ("public", "POST", "/v1/rules/{tenant}/what-if"): _row(RULE_READERS),
    ("public", "GET", "/healthz"): _row(EVERYONE),
    ("public", "GET", "/readyz"): _row(EVERYONE),
    ("admin", "GET", "/metrics"): _row(EVERYONE),  # the admin port is not on the public network
    ("admin", "GET", "/healthz"): _row(EVERYONE),
    ("admin", "GET", "/readyz"): _row(EVERYONE),
    **{
        ("admin", method, path): _row({"admin"})
        for method, path in [
            ("GET", "/v1/admin/tenants"),
            ("POST", "/v1/admin/tenants"),
            ("GET", "/v1/admin/tenants/{name}"),
            ("PATCH", "/v1/admin/tenants/{name}"),
            ("DELETE", "/v1/admin/tenants/{name}"),
            ("GET", "/v1/admin/keys"),
            ("POST", "/v1/admin/keys"),
            ("GET", "/v1/admin/keys/{key_id}"),
            ("POST", "/v1/admin/keys/{key_id}/rotate"),
            ("POST", "/v1/admin/keys/{key_id}/revoke"),
        ]
    },
}

# Another tenant's data, asked for by acme's tenant and rules keys: always refused.
CROSS_TENANT = [
    ("GET", "/v1/rules/globex", None),
    ("PUT", "/v1/rules/globex", "rules: []\n"),
    ("POST", "/v1/rules/globex/validate", "rules: []\n"),
    ("DELETE", "/v1/rules/globex", None),
    ("GET", "/v1/rules/globex/versions", None),
    ("POST", "/v1/rules/globex/rollback?to=1", None),
    ("GET", "/v1/rules/globex/figures", None),
    ("POST", "/v1/rules/globex/explain", None),
    ("POST", "/v1/rules/globex/what-if", "rules: []\n"),
    ("GET", "/v1/reports/costs?tenant=globex", None),
    ("POST", "/v1/route/explain?tenant=globex", None),
]

PARAMS = {"tenant": "acme", "version": "1", "name": "nobody-x", "key_id": "000000000000"}


@dataclass
class Principals:
    keys: dict[str, str | None]


@pytest.fixture
async def principals(services: Services) -> Principals:
    assert services.auth is not None
    admin = AuthAdmin(services.auth.store, services.auth.changes, services.auth)
    rules = await admin.create_key("acme-rules", ["rules:acme"])
    revoked = await admin.create_key("acme-old", ["tenant:acme"])
    await admin.revoke_key(revoked.record.key_id)
    return Principals(
        {
            "anonymous": None,
            "invalid": "tgk_000000000000_" + "x" * 43,
            "revoked": revoked.key,
            "tenant": "dev-acme",
            "rules": rules.key,
            "finance": "dev-finance",
            "admin": "dev-admin",
        }
    )


@pytest.fixture
async def clients(services: Services) -> AsyncIterator[dict[str, httpx.AsyncClient]]:
    public = create_app(services=services)
    public.state.services = services
    apps = {"public": public, "admin": create_admin_app(services)}
    opened = {
        name: httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=f"http://{name}")
        for name, app in apps.items()
    }
    try:
        yield opened
    finally:
        for client in opened.values():
            await client.aclose()


def _all_routes(services: Services | None) -> list[tuple[str, str, str, list[str]]]:
    apps: dict[str, FastAPI] = {
        "public": create_app(services=services) if services else create_app_for_listing(),
        "admin": create_admin_app(services),  # type: ignore[arg-type]
    }
    found = []
    for name, app in apps.items():
        for route in _routes(app.routes):
            roles = sorted({r for g in _guards(route.dependant) for r in g.roles})
            for method in sorted(route.methods):
                found.append((name, method, route.path, roles))
    return found


def create_app_for_listing() -> FastAPI:
    from tests.gateway.api.test_access import EXAMPLE, load_settings

    return create_app(load_settings(EXAMPLE))


def test_every_route_is_guarded() -> None:
    routes = _all_routes(None)
    assert len(routes) >= len(POLICY)
    assert [r for r in routes if not r[3]] == []


def _expected(app: str, method: str, path: str, roles: list[str]) -> dict[str, object]:
    pinned = POLICY.get((app, method, path))
    if pinned is not None:
        return pinned
    allowed = set().union(*(ORACLE[r] for r in roles))
    return _row(allowed)


async def test_matrix(
    services: Services, clients: dict[str, httpx.AsyncClient], principals: Principals
) -> None:
    routes = _all_routes(services)
    failures: list[str] = []
    cells = 0
    for app, method, path, roles in routes:
        url = re.sub(r"\{(\w+)\}", lambda m: PARAMS[m.group(1)], path)
        for kind, outcome in _expected(app, method, path, roles).items():
            key = principals.keys[kind]
            headers = {"authorization": f"Bearer {key}"} if key else {}
            body = {} if method in ("POST", "PUT", "PATCH") else None
            response = await clients[app].request(method, url, json=body, headers=headers)
            cells += 1
            got = response.status_code
            fine = got not in (401, 403) if outcome == OK else got == outcome
            if got >= 500 and not (path == "/readyz" and got == 503):
                fine = False
            if not fine:
                failures.append(f"{app} {method} {path} as {kind}: {got}, expected {outcome}")
            if got in (401, 403):
                assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert failures == []
    assert cells == len(routes) * len(KINDS)


async def test_no_tenant_reaches_another(
    clients: dict[str, httpx.AsyncClient], principals: Principals
) -> None:
    for kind in ("tenant", "rules"):
        headers = {"authorization": f"Bearer {principals.keys[kind]}"}
        for method, url, content in CROSS_TENANT:
            kwargs: dict[str, object] = {"content": content} if content else {"json": {}}
            response = await clients["public"].request(method, url, headers=headers, **kwargs)  # type: ignore[arg-type]
            assert response.status_code == 403, (kind, method, url, response.text)
    finance = {"authorization": f"Bearer {principals.keys['finance']}"}
    response = await clients["public"].get("/v1/reports/costs?tenant=globex", headers=finance)
    assert response.status_code == 200
    for url in ("/v1/rules/globex", "/v1/rules/globex/figures"):  # finance reads every tenant
        assert (await clients["public"].get(url, headers=finance)).status_code == 200
    for method, url in (("PUT", "/v1/rules/globex"), ("POST", "/v1/rules/globex/validate")):
        refused = await clients["public"].request(
            method, url, content="rules: []\n", headers=finance
        )
        assert refused.status_code == 403  # and writes none


async def test_each_port_serves_only_its_own_routes(
    services: Services, clients: dict[str, httpx.AsyncClient]
) -> None:
    routes = _all_routes(services)
    paths = {app: {(m, p) for a, m, p, _ in routes if a == app} for app in ("public", "admin")}
    admin_headers = {"authorization": "Bearer dev-admin"}
    for here, other in (("public", "admin"), ("admin", "public")):
        for method, path in sorted(paths[other] - paths[here]):
            url = re.sub(r"\{(\w+)\}", lambda m: PARAMS[m.group(1)], path)
            body = {} if method in ("POST", "PUT", "PATCH") else None
            response = await clients[here].request(method, url, json=body, headers=admin_headers)
            assert response.status_code in (404, 405), (here, method, path, response.status_code)
    assert services.settings.server.port != services.settings.server.admin_port
