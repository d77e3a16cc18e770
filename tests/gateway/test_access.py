"""Every route of both apps declares who may call it (the matrix of issue 8 builds on this)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from gateway.app import create_admin_app, create_app
from gateway.auth.access import AccessGuard, access
from gateway.settings import load_settings

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "config.example.yaml"


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
