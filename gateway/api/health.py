"""``/healthz`` (the process is alive) and ``/readyz`` (Redis, database and workers usable).

An open circuit on one deployment does not make the gateway unready: other deployments and
fallbacks still serve. Nor does the ledger: requests are answered while the sink is paused (their
events wait in Redis), so ``/readyz`` shows the ledger's state beside the checks instead — the
sink's state in a process that runs one, and how many events it set aside as dead letters
(``gateway.accounting.dead_letters``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

from gateway.api.access import PUBLIC, access
from gateway.api.deps import ServicesDep

__all__ = ["router"]

router = APIRouter(dependencies=[access(PUBLIC)])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


async def _ping(ping: Awaitable[object], timeout_s: float, error: type[Exception]) -> str:
    """A dependency's check: ``ok``, or why ``ping`` failed (its client's ``error``, the network)
    or did not answer within ``timeout_s``."""
    try:
        await asyncio.wait_for(ping, timeout_s)
    except (error, OSError, TimeoutError) as exc:
        return f"unavailable: {type(exc).__name__}"
    return "ok"


async def _check_redis(services: ServicesDep) -> str:
    return await _ping(services.redis.ping(), 1.0, RedisError)


async def _check_database(services: ServicesDep) -> str:
    return await _ping(services.ledger.ping(), 2.0, SQLAlchemyError)


async def _check_workers(services: ServicesDep) -> str:
    if services.worker is not None:
        return "ok"
    try:
        async for _key in services.redis.scan_iter(match=services.redis_keys.worker_pattern):
            return "ok"
    except (RedisError, OSError) as exc:
        return f"unavailable: {type(exc).__name__}"
    return "unavailable: no worker heartbeat"


async def _ledger_detail(services: ServicesDep) -> dict[str, Any]:
    detail: dict[str, Any] = {}
    if services.ledger_sink is not None:
        detail["sink"] = services.ledger_sink.state
    try:
        dead = await asyncio.wait_for(
            services.redis.xlen(services.redis_keys.ledger_dead_letters), 1.0
        )
    except (RedisError, OSError, TimeoutError) as exc:
        detail["dead_letters"] = f"unknown: {type(exc).__name__}"
    else:
        detail["dead_letters"] = int(dead)
    return detail


@router.get("/readyz")
async def readyz(services: ServicesDep) -> JSONResponse:
    redis_state, db_state = await asyncio.gather(_check_redis(services), _check_database(services))
    workers_state = await _check_workers(services) if redis_state == "ok" else "unknown"
    checks: dict[str, Any] = {"redis": redis_state, "database": db_state, "workers": workers_state}
    ready = all(v == "ok" for v in checks.values())
    ledger = await _ledger_detail(services) if redis_state == "ok" else {}
    return JSONResponse(
        {"status": "ready" if ready else "unavailable", "checks": checks, "ledger": ledger},
        status_code=200 if ready else 503,
    )
