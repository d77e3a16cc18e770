"""Reports over HTTP: ``GET /v1/reports/costs`` (JSON or CSV), ``/v1/reports/what-if``,
``/v1/reports/budgets`` and ``/v1/reports/gpu-rates``.

Scope is decided here, never by the caller's parameters alone: a tenant's key (``tenant:<name>``
or ``rules:<name>``) always reads its own tenant — asking for another one is refused with 403, and
grouping by ``tenant`` shows only itself; ``finance`` and ``admin`` keys read every tenant and may
narrow to one with ``tenant=``.
"""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response
from redis.exceptions import RedisError

from gateway.accounting.records import MICRO
from gateway.accounting.reports import GROUP_KEYS, cost_report, render_csv, render_json
from gateway.accounting.whatif import render_what_if, what_if
from gateway.api.access import ADMIN, FINANCE, TENANT, access
from gateway.api.deps import ServicesDep
from gateway.api.error_docs import refusals
from gateway.api.period import PeriodDep
from gateway.auth.principals import Principal
from gateway.errors import InvalidRequest, PermissionDenied, ServiceUnavailable
from gateway.safe_text import SafeName

__all__ = ["report_scope", "router"]

router = APIRouter(responses=refusals(400))


def report_scope(principal: Principal, requested: str | None) -> str | None:
    """The tenant a report may cover: ``None`` means every tenant (finance and admin only)."""
    if principal.is_admin or "finance" in principal.roles:
        return requested
    own = principal.tenant
    if own is None:
        raise PermissionDenied(f"principal {principal.name!r} may not read cost reports")
    if requested is not None and requested != own:
        raise PermissionDenied(f"principal {principal.name!r} may read only tenant {own!r}")
    return own


def parse_group_by(raw: str) -> tuple[str, ...]:
    keys = tuple(k.strip() for k in raw.split(",") if k.strip())
    bad = [k for k in keys if k not in GROUP_KEYS]
    if bad or len(set(keys)) != len(keys):
        raise InvalidRequest(
            f"group_by {raw!r}: use distinct keys of {', '.join(GROUP_KEYS)}", param="group_by"
        )
    return keys


@router.get("/v1/reports/costs")
async def costs(
    services: ServicesDep,
    principal: Annotated[Principal, access(TENANT, FINANCE, ADMIN)],
    period: PeriodDep,
    group_by: Annotated[str, Query(description="comma-separated group keys")] = "day",
    tenant: Annotated[SafeName | None, Query(description="finance/admin: one tenant")] = None,
    format: Annotated[Literal["json", "csv"], Query()] = "json",
    app: Annotated[SafeName | None, Query(description="one app (x-tiergate-app)")] = None,
) -> Response:
    scope = report_scope(principal, tenant)
    keys = parse_group_by(group_by)
    start, end = period.start, period.end
    report = await cost_report(
        services.ledger, tenant=scope, start=start, end=end, group_by=keys, app=app or None
    )
    if format == "csv":
        name = f"costs-{scope or 'all'}-{start or 'start'}-{end or 'end'}.csv"
        return Response(
            render_csv(report),
            media_type="text/csv; charset=utf-8",
            headers={"content-disposition": f'attachment; filename="{name}"'},
        )
    return JSONResponse(render_json(report))


@router.get("/v1/reports/what-if")
async def what_if_report(
    services: ServicesDep,
    principal: Annotated[Principal, access(TENANT, FINANCE, ADMIN)],
    period: PeriodDep,
    tenant: Annotated[SafeName | None, Query(description="finance/admin: one tenant")] = None,
) -> JSONResponse:
    """The period's tokens priced as routed, all on the external API, all self-hosted."""
    scope = report_scope(principal, tenant)
    result = await what_if(
        services.ledger,
        services.prices,
        services.settings.deployments,
        tenant=scope,
        start=period.start,
        end=period.end,
    )
    return JSONResponse(render_what_if(result))


@router.get("/v1/reports/budgets")
async def budgets_report(
    services: ServicesDep,
    principal: Annotated[Principal, access(TENANT, FINANCE, ADMIN)],
    tenant: Annotated[SafeName | None, Query(description="finance/admin: one tenant")] = None,
) -> JSONResponse:
    """Each budget's window, limit, spend and reservations now (from Redis)."""
    scope = report_scope(principal, tenant)
    book = services.budgets
    names = [scope] if scope is not None else sorted(services.policies)  # run-time ones too
    rows: list[dict[str, object]] = []
    for name in names:
        for status in await book.status(name):
            rows.append(
                {
                    "tenant": name,
                    "budget": status.name,
                    "mode": status.mode,
                    "app": status.app,
                    "tag": status.tag,
                    "window_start": status.window_start.isoformat(),
                    "window_end": status.window_end.isoformat(),
                    "limit_usd": _usd(status.limit_micro_usd),
                    "spent_usd": _usd(status.spent_micro_usd),
                    "reserved_usd": _usd(status.reserved_micro_usd),
                }
            )
    return JSONResponse({"tenant": scope, "budgets": rows})


def _usd(micro: int) -> str:
    return f"{(Decimal(micro) * MICRO).quantize(MICRO):f}"


@router.get("/v1/reports/gpu-rates")
async def gpu_rates_report(
    services: ServicesDep,
    principal: Annotated[Principal, access(TENANT, FINANCE, ADMIN)],
) -> JSONResponse:
    """Each GPU-priced pool's rate for this pricing period and the next (published a period
    ahead), with the window and figures each was computed from."""
    try:
        await services.prices.ensure_rates()
    except (RedisError, OSError) as exc:
        raise ServiceUnavailable(f"GPU rates unavailable: {type(exc).__name__}") from exc
    pools = []
    for pool in services.prices.gpu_pools:
        now = services.prices.gpu_rate(pool.deployment)
        ahead = services.prices.gpu_rate(pool.deployment, time.time() + pool.period_s)
        pools.append(
            {
                "deployment": pool.deployment,
                "replica_hourly_usd": f"{pool.replica_hourly_usd:f}",
                "period_s": pool.period_s,
                "current": None if now is None else now.as_dict(),
                "next": None if ahead is None else ahead.as_dict(),
            }
        )
    return JSONResponse({"pools": pools})
