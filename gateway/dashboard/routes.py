"""``GET /dashboard`` (costs) and ``GET /dashboard/rules`` (the rules console), and their assets.
Nothing here reads data: each page signs in with a key (kept in the tab's ``sessionStorage``)
and calls the reports or rules API with it, so the API's scoping (a tenant sees only itself) is
the pages' too. No external resources: the content security
policy allows only this origin."""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

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


def _asset(name: str) -> str:
    return (_ASSETS / name).read_text(encoding="utf-8")


@router.get("/dashboard", dependencies=[access(PUBLIC)], include_in_schema=False)
async def dashboard() -> HTMLResponse:
    return HTMLResponse(_asset("dashboard.html"), headers=_HEADERS)


@router.get("/dashboard/app.js", dependencies=[access(PUBLIC)], include_in_schema=False)
async def dashboard_js() -> Response:
    return Response(_asset("dashboard.js"), media_type="text/javascript", headers=_HEADERS)


@router.get("/dashboard/app.css", dependencies=[access(PUBLIC)], include_in_schema=False)
async def dashboard_css() -> Response:
    return Response(_asset("dashboard.css"), media_type="text/css", headers=_HEADERS)


@router.get("/dashboard/session.js", dependencies=[access(PUBLIC)], include_in_schema=False)
async def session_js() -> Response:
    """What both pages share: the signed-in key, sign-in states, the link's filters, money."""
    return Response(_asset("session.js"), media_type="text/javascript", headers=_HEADERS)


@router.get("/dashboard/rules", dependencies=[access(PUBLIC)], include_in_schema=False)
async def rules_console() -> HTMLResponse:
    """The rules console: the same sign-in, the rules API's scoping (docs/rules.md)."""
    return HTMLResponse(_asset("rules.html"), headers=_HEADERS)


@router.get("/dashboard/rules.js", dependencies=[access(PUBLIC)], include_in_schema=False)
async def rules_console_js() -> Response:
    return Response(_asset("rules.js"), media_type="text/javascript", headers=_HEADERS)


@router.get("/dashboard/rules.css", dependencies=[access(PUBLIC)], include_in_schema=False)
async def rules_console_css() -> Response:
    return Response(_asset("rules.css"), media_type="text/css", headers=_HEADERS)
