"""What handlers receive: the services, and the authenticated principal."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from gateway.auth.principals import Principal
from gateway.errors import AuthenticationFailed
from gateway.parts import Services

__all__ = ["ServicesDep", "authenticate", "get_services"]


def _services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


async def get_services(request: Request) -> Services:
    # async: FastAPI runs a plain ``def`` dependency in a worker thread, a hop per request.
    return _services(request)


def authenticate(request: Request) -> Principal:
    """The caller's principal from ``Authorization: Bearer <key>`` (or ``api-key``)."""
    services = _services(request)
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        key = request.headers.get("api-key", "")
        if not key:
            services.metrics.unauthenticated.labels("missing_key").inc()
            raise AuthenticationFailed(
                "missing API key: send it as 'Authorization: Bearer <key>'", code="missing_api_key"
            )
    principal = services.keys.authenticate(key.strip())
    if principal is None:
        services.metrics.unauthenticated.labels("invalid_key").inc()
        raise AuthenticationFailed("invalid API key")
    return principal


ServicesDep = Annotated[Services, Depends(get_services)]
