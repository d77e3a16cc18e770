"""The whole stack as real processes: three simulators and `tiergate serve`, real Redis, SQLite."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tests.support import (
    TEST_KEYS,
    Proc,
    free_port,
    gateway_config,
    start_gateway,
    start_sim,
    wait_ready,
)

PROFILES = ("llama-3.1-8b-instruct", "llama-3.1-70b-instruct-awq", "gpt-4o-mini")


@dataclass
class Stack:
    base_url: str
    admin_url: str
    database_url: str
    config: Path
    usage_logs: dict[str, Path]
    gateway: Proc
    prefix: str

    def key(self, tenant: str) -> str:
        return TEST_KEYS[f"TIERGATE_KEY_{tenant.upper()}"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("stack")
    sims: list[Proc] = []
    usage: dict[str, Path] = {}
    ports = {profile: free_port() for profile in PROFILES}
    prefix = f"tgtest-{uuid.uuid4().hex[:10]}"
    gateway: Proc | None = None
    try:
        for profile, port in ports.items():
            proc, log = start_sim(profile, port, workdir)
            sims.append(proc)
            usage[profile] = log
        port, admin_port = free_port(), free_port()
        database_url = f"sqlite+aiosqlite:///{workdir / 'ledger.db'}"
        config = gateway_config(
            workdir=workdir,
            redis_url=redis_url,
            prefix=prefix,
            database_url=database_url,
            sim_ports=ports,
            port=port,
            admin_port=admin_port,
        )
        gateway = start_gateway(config, workdir)
        wait_ready(gateway, f"http://127.0.0.1:{port}/readyz")
        yield Stack(
            base_url=f"http://127.0.0.1:{port}",
            admin_url=f"http://127.0.0.1:{admin_port}",
            database_url=database_url,
            config=config,
            usage_logs=usage,
            gateway=gateway,
            prefix=prefix,
        )
    finally:
        if gateway is not None:
            gateway.stop()
        for proc in sims:
            proc.stop()
        client = redis.Redis.from_url(redis_url)
        for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            client.delete(key)
        client.close()
