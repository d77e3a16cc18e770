"""``GET /docs``: Swagger UI over the app's own ``/openapi.json``, and its assets.

FastAPI's ``/docs`` loads Swagger UI from a CDN; these pages must work offline, so the assets
are vendored in ``assets/`` (Swagger UI 5.36.0, Apache-2.0, its licence beside it) and served
from the package, the init script included, under a content security policy that allows this
origin only (Swagger UI sets inline styles, and draws icons as ``data:`` images). The public
app and the admin app each serve it for their own schema (``docs_router(title)``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from importlib.resources import files
from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from gateway.api.access import PUBLIC, access

__all__ = ["SWAGGER_UI_VERSION", "docs_router", "index_router"]

SWAGGER_UI_VERSION = "5.36.0"
_ASSETS = files("gateway.api.apidocs") / "assets"
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
_HEADERS = {
    "content-security-policy": _CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}
_CACHED = {**_HEADERS, "cache-control": "public, max-age=86400"}
_FILES = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "init.js": "text/javascript; charset=utf-8",
    "favicon.png": "image/png",
}


def _read(name: str) -> bytes:
    return (_ASSETS / ("favicon-32x32.png" if name == "favicon.png" else name)).read_bytes()


def docs_router(title: str) -> APIRouter:
    """``/docs`` and its assets, the page titled ``title``."""
    router = APIRouter(include_in_schema=False, dependencies=[access(PUBLIC)])
    page = _read("docs.html").decode().replace("__TITLE__", title)

    @router.get("/docs")
    async def docs() -> HTMLResponse:
        return HTMLResponse(page, headers={**_HEADERS, "cache-control": "no-store"})

    for name, media_type in _FILES.items():
        router.add_api_route(f"/docs/{name}", _asset(_read(name), media_type), methods=["GET"])
    return router


def _asset(body: bytes, media_type: str) -> Callable[[], Awaitable[Response]]:
    async def asset() -> Response:
        return Response(body, media_type=media_type, headers=_CACHED)

    return asset


def index_router(title: str, links: Mapping[str, str]) -> APIRouter:
    """``GET /``: a small JSON pointer to what this port serves (``links``: path → what)."""
    router = APIRouter(include_in_schema=False, dependencies=[access(PUBLIC)])
    body = {"name": title, "links": [{"href": href, "what": what} for href, what in links.items()]}

    @router.get("/")
    async def index() -> dict[str, Any]:
        return body

    return router
