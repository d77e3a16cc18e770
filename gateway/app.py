"""The app factories: the public API, and the admin app (metrics) for its own port."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager

from fastapi import APIRouter, FastAPI
from fastapi.responses import Response
from fastapi.telemetry import TelemetryConfig
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway import dashboard
from gateway.api import (
    admin_keys,
    admin_tenants,
    chat,
    completions,
    embeddings,
    explain,
    health,
    models,
    reports,
    rules,
    rules_console,
)
from gateway.api.access import PUBLIC, access
from gateway.api.apidocs import docs_router, index_router
from gateway.api.error_docs import drop_validation_422
from gateway.api.errors import install_error_handlers
from gateway.api.inflight import CountInflight, InflightRequests
from gateway.observability.tracing import TracingMiddleware
from gateway.services import Services, open_services
from gateway.settings import Settings

__all__ = ["create_admin_app", "create_app"]

_NO_NATIVE_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}
"""FastAPI's own OpenTelemetry hooks stay off (they would check the global providers on every
request); tiergate's traces are its own (``gateway.observability.tracing``)."""


def create_app(
    settings: Settings | None = None,
    *,
    services: Services | None = None,
    dev: bool = False,
    workers: bool = True,
) -> FastAPI:
    """The public app. With ``services`` the caller owns them; otherwise the lifespan builds
    them from ``settings`` and closes them at shutdown."""
    if services is None and settings is None:
        raise ValueError("create_app needs settings or services")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if services is not None:
            app.state.services = services
            yield
            return
        assert settings is not None
        async with open_services(settings, dev=dev, workers=workers) as built:
            app.state.services = built
            yield

    app = _tiergate_app(
        "tiergate",
        _PUBLIC_LINKS,
        [
            chat.router,
            completions.router,
            embeddings.router,
            models.router,
            reports.router,
            dashboard.router,
            explain.router,
            rules_console.router,
            rules.router,
            health.router,
        ],
        lifespan=lifespan,
    )
    traced = (
        services.tracing.enabled
        if services is not None
        else bool(settings and settings.tracing.enabled)
    )
    if traced:  # off: no middleware at all, nothing on the request path
        app.add_middleware(TracingMiddleware)
    app.state.inflight = InflightRequests()
    app.add_middleware(CountInflight, inflight=app.state.inflight)
    return app


_PUBLIC_LINKS = {
    "/docs": "the API's reference (Swagger UI)",
    "/openapi.json": "the API's OpenAPI schema",
    "/v1/models": "the models a key may ask for",
    "/dashboard": "the cost dashboard",
    "/dashboard/rules": "the rules console",
}
_ADMIN_LINKS = {
    "/docs": "the admin API's reference (Swagger UI)",
    "/openapi.json": "the admin API's OpenAPI schema",
    "/metrics": "Prometheus metrics",
    "/v1/admin/tenants": "tenants (admin key)",
}


def create_admin_app(services: Services) -> FastAPI:
    """The admin port: Prometheus metrics and the tenant and key admin API (neither exposed on
    the public port), and their schema at ``/openapi.json`` (no key needed, as for metrics: it
    holds no data, and the admin port is not on the public network)."""
    app = _tiergate_app(
        "tiergate admin",
        _ADMIN_LINKS,
        [_metrics_router(services), health.router, admin_tenants.router, admin_keys.router],
    )
    app.state.services = services
    return app


def _tiergate_app(
    title: str,
    links: Mapping[str, str],
    routers: Sequence[APIRouter],
    *,
    lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]] | None = None,
) -> FastAPI:
    """An app of tiergate's: ``routers``, then the docs (``gateway.api.apidocs``, in place of
    FastAPI's own) and the index at ``/`` pointing at ``links``; errors answered in OpenAI's
    shape, no generic 422 in the schema, no native telemetry."""
    app = FastAPI(
        title=title,
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        telemetry=_NO_NATIVE_TELEMETRY,
    )
    install_error_handlers(app)
    drop_validation_422(app)
    for router in (*routers, docs_router(title), index_router(title, links)):
        app.include_router(router)
    return app


def _metrics_router(services: Services) -> APIRouter:
    """``GET /metrics``: the Prometheus exposition of ``services``' registry."""
    router = APIRouter()

    @router.get("/metrics", dependencies=[access(PUBLIC)])
    async def metrics() -> Response:
        await _refresh_queue_depth(services)
        return Response(generate_latest(services.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return router


async def _refresh_queue_depth(services: Services) -> None:
    from gateway.queue.edge.signals import publish_queue_metrics

    publish_queue_metrics(services.queue_snapshot, services.metrics)
