"""``/healthz`` (the process is alive) and ``/readyz`` (Redis, database and workers usable).

An open circuit on one deployment does not make the gateway unready: other deployments and
fallbacks still serve."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

from gateway.api.deps import ServicesDep
from gateway.auth.access import PUBLIC, access

__all__ = ["router"]

router = APIRouter(dependencies=[access(PUBLIC)])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


async def _check_redis(services: ServicesDep) -> str:
    try:
        await asyncio.wait_for(services.redis.ping(), 1.0)
    except (RedisError, OSError, TimeoutError) as exc:
        return f"unavailable: {type(exc).__name__}"
    return "ok"


async def _check_database(services: ServicesDep) -> str:
    try:
        await asyncio.wait_for(services.ledger.ping(), 2.0)
    except (SQLAlchemyError, OSError, TimeoutError) as exc:
        return f"unavailable: {type(exc).__name__}"
    return "ok"


async def _check_workers(services: ServicesDep) -> str:
    if services.worker is not None:
        return "ok"
    try:
        async for _key in services.redis.scan_iter(match=services.redis_keys.worker_pattern):
            return "ok"
    except (RedisError, OSError) as exc:
        return f"unavailable: {type(exc).__name__}"
    return "unavailable: no worker heartbeat"


@router.get("/readyz")
async def readyz(services: ServicesDep) -> JSONResponse:
    redis_state, db_state = await asyncio.gather(_check_redis(services), _check_database(services))
    workers_state = await _check_workers(services) if redis_state == "ok" else "unknown"
    checks: dict[str, Any] = {"redis": redis_state, "database": db_state, "workers": workers_state}
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse(
        {"status": "ready" if ready else "unavailable", "checks": checks},
        status_code=200 if ready else 503,
    )
