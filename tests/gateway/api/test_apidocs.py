"""``/docs`` on both ports and ``/``: Swagger UI from the package's own assets, nothing from
another origin (it must work offline), and a pointer at ``/``."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from gateway.api.apidocs import SWAGGER_UI_VERSION
from gateway.app import create_admin_app
from tests.gateway.accounting.apps import app_settings, running_app

ASSETS = Path(__file__).resolve().parents[3] / "gateway" / "api" / "apidocs" / "assets"


async def _docs_work_offline(client: httpx.AsyncClient, operation: str) -> None:
    page = await client.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "http" not in csp and "script-src 'self';" in csp
    refs = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert refs and all(ref.startswith("/docs/") for ref in refs), refs
    for ref in refs:
        asset = await client.get(ref)
        assert asset.status_code == 200 and asset.content, ref
    init = (await client.get("/docs/init.js")).text
    assert '"/openapi.json"' in init
    schema = (await client.get("/openapi.json")).json()
    assert operation in schema["paths"]


async def test_public_docs_and_index(redis_url: str, key_prefix: str, tmp_path: Path) -> None:
    settings = app_settings(redis_url, key_prefix, tmp_path)
    async with running_app(settings) as (services, client):
        await _docs_work_offline(client, "/v1/embeddings")
        index = await client.get("/")
        assert index.status_code == 200
        hrefs = {link["href"] for link in index.json()["links"]}
        assert {"/docs", "/dashboard", "/v1/models"} <= hrefs
        admin = create_admin_app(services)
        transport = httpx.ASGITransport(app=admin)
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as admin_http:
            await _docs_work_offline(admin_http, "/v1/admin/tenants")
            assert "/metrics" in {
                link["href"] for link in (await admin_http.get("/")).json()["links"]
            }


def test_the_vendored_swagger_ui_keeps_its_licence() -> None:
    assert (ASSETS / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert "SmartBear" in (ASSETS / "NOTICE").read_text()
    assert SWAGGER_UI_VERSION in (ASSETS / "README.md").read_text()
    bundle = (ASSETS / "swagger-ui-bundle.js").read_text()
    assert "swagger-ui-bundle.js.LICENSE.txt" in bundle[:200]
    assert "cdn.jsdelivr" not in bundle and "unpkg.com" not in bundle
