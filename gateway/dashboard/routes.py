"""``GET /dashboard`` (costs) and ``GET /dashboard/rules`` (the rules console), and their assets.
Nothing here reads data: each page signs in with a key (kept in the tab's ``sessionStorage``)
and calls the reports or rules API with it, so the API's scoping (a tenant sees only itself) is
the pages' too. No external resources: the content security
policy allows only this origin."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import Response

from gateway.api.access import PUBLIC, access

__all__ = ["router"]

router = APIRouter()

_ASSETS = files("gateway.dashboard") / "assets"
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_HEADERS = {
    "content-security-policy": _CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


_FILES = {  # path: (asset, media type)
    "/dashboard": ("dashboard.html", "text/html"),
    "/dashboard/app.js": ("dashboard.js", "text/javascript"),
    "/dashboard/app.css": ("dashboard.css", "text/css"),
    # what both pages share: the signed-in key, sign-in states, the link's filters, money
    "/dashboard/session.js": ("session.js", "text/javascript"),
    # the rules console: the same sign-in, the rules API's scoping (docs/rules.md)
    "/dashboard/rules": ("rules.html", "text/html"),
    "/dashboard/rules.js": ("rules.js", "text/javascript"),
    "/dashboard/rules.css": ("rules.css", "text/css"),
}


def _serves(name: str, media_type: str) -> Callable[[], Awaitable[Response]]:
    async def serve() -> Response:
        body = (_ASSETS / name).read_text(encoding="utf-8")
        return Response(body, media_type=media_type, headers=_HEADERS)

    return serve


for _path, (_name, _media_type) in _FILES.items():
    router.add_api_route(
        _path,
        _serves(_name, _media_type),
        methods=["GET"],
        dependencies=[access(PUBLIC)],
        include_in_schema=False,
    )
