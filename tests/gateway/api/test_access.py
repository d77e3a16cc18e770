"""Every route of both apps declares who may call it (the matrix of issue 8 builds on this)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from gateway.api.access import AccessGuard, access
from gateway.app import create_admin_app, create_app
from gateway.settings import load_settings

EXAMPLE = Path(__file__).resolve().parents[3] / "deploy" / "config.example.yaml"
PLAIN_ALLOWED = {"/openapi.json"}
"""Routes that cannot declare roles: only FastAPI's own schema, public by design (the fuzzer and
clients read it; it holds no data)."""


def _guards(dependant: Dependant) -> list[AccessGuard]:
    found = [dependant.call] if isinstance(dependant.call, AccessGuard) else []
    for sub in dependant.dependencies:
        found += _guards(sub)
    return found


def _routes(routes: Sequence[BaseRoute]) -> list[APIRoute]:
    """Every API route, including those of included routers (FastAPI includes them lazily)."""
    found: list[APIRoute] = []
    for route in routes:
        if isinstance(route, APIRoute):
            found.append(route)
        elif (inner := getattr(route, "original_router", None)) is not None:
            found += _routes(inner.routes)
    return found


def _plain(routes: Sequence[BaseRoute]) -> list[str]:
    """Every route that is not an API route (a Starlette ``Route``, a ``Mount``, ...): it has no
    dependencies, so it could never declare roles and ``_routes`` does not see it."""
    found: list[str] = []
    for route in routes:
        if isinstance(route, APIRoute):
            continue
        if (inner := getattr(route, "original_router", None)) is not None:
            found += _plain(inner.routes)
        else:
            found.append(getattr(route, "path", repr(route)))
    return found


def test_no_route_escapes_the_declarations() -> None:
    public = create_app(load_settings(EXAMPLE))
    admin = create_admin_app(services=None)  # type: ignore[arg-type]
    assert set(_plain(public.routes) + _plain(admin.routes)) <= PLAIN_ALLOWED


def test_every_route_declares_its_roles() -> None:
    public = create_app(load_settings(EXAMPLE))
    admin = create_admin_app(services=None)  # type: ignore[arg-type]
    routes = _routes(public.routes) + _routes(admin.routes)
    assert len(routes) >= 5
    undeclared = [f"{sorted(r.methods)} {r.path}" for r in routes if not _guards(r.dependant)]
    assert undeclared == []


def test_unknown_roles_are_refused_at_definition() -> None:
    with pytest.raises(ValueError):
        access("superuser")
    with pytest.raises(ValueError):
        access()
