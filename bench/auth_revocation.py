"""Run-time keys: how fast a revocation reaches another process's copy, and what one lookup costs.

Two ``RuntimeAuth`` copies (as two gateway processes hold them) over one SQLite file and one
Redis (``--redis``, default the test Redis). For each of ``--rounds`` keys: issue it, wait until
the other copy accepts it, revoke it through the first, and time until the other copy refuses
it (``propagation``, from the revoke call's return) and the revoke call itself (SQL commit +
Redis publish + the writer's own reload). Then ``authenticate`` of a valid key, timed over
``--lookups`` calls.

    .venv/bin/python bench/auth_revocation.py        # writes bench/results/auth_revocation.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from gateway.auth.admin import AuthAdmin
from gateway.auth.changes import AuthChanges
from gateway.auth.runtime import RuntimeAuth
from gateway.auth.store import SqlAuthStore

RESULTS = Path(__file__).resolve().parent / "results" / "auth_revocation.json"


def _ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))] * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
    }


async def run(redis_url: str, rounds: int, lookups: int) -> dict[str, Any]:
    prefix = f"tgbench-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite+aiosqlite:///{Path(tmp) / 'auth.db'}"
        stores = [await SqlAuthStore.connect(url) for _ in range(2)]
        clients = [aioredis.Redis.from_url(redis_url) for _ in range(2)]
        here, there = (
            RuntimeAuth(s, AuthChanges(c, prefix)) for s, c in zip(stores, clients, strict=True)
        )
        await here.start()
        await there.start()
        admin = AuthAdmin(stores[0], here.changes, here)
        propagation: list[float] = []
        revoke_call: list[float] = []
        try:
            for _ in range(rounds):
                issued = await admin.create_key("bench", ["tenant:acme"])
                while there.authenticate(issued.key) is None:  # noqa: ASYNC110 (polling is the point)
                    await asyncio.sleep(0.0005)
                started = time.perf_counter()
                await admin.revoke_key(issued.record.key_id)
                returned = time.perf_counter()
                while there.authenticate(issued.key) is not None:  # noqa: ASYNC110
                    await asyncio.sleep(0.0005)
                propagation.append(time.perf_counter() - returned)
                revoke_call.append(returned - started)
            key = (await admin.create_key("bench", ["tenant:acme"])).key
            started = time.perf_counter()
            for _ in range(lookups):
                here.authenticate(key)
            per_lookup_us = (time.perf_counter() - started) / lookups * 1e6
        finally:
            for copy in (here, there):
                await copy.aclose()
            for client in clients:
                await client.delete(f"{prefix}:auth:version")
                await client.aclose()
            for store in stores:
                await store.aclose()
    return {
        "rounds": rounds,
        "propagation_after_revoke_returns": _ms(propagation),
        "revoke_call": _ms(revoke_call),
        "authenticate_us": round(per_lookup_us, 2),
        "machine": platform.platform(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--lookups", type=int, default=50_000)
    args = parser.parse_args()
    result = asyncio.run(run(args.redis, args.rounds, args.lookups))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
