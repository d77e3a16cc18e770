"""Two real gateway processes sharing one SQLite file and the test Redis (own key prefix)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import (
    Proc,
    drop_prefix,
    free_port,
    gateway_config,
    new_prefix,
    start_gateway,
    wait_http,
)


@dataclass
class Gateway:
    proc: Proc
    url: str
    admin_url: str


@dataclass
class Pair:
    a: Gateway
    b: Gateway
    config: Path
    prefix: str


def _start(config: Path, workdir: Path, name: str, port: int, admin_port: int) -> Gateway:
    proc = start_gateway(
        config, workdir, "--no-workers", "--port", str(port), name=name
    )  # the admin port comes from the config, so each process gets its own config
    gw = Gateway(proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}")
    if not wait_http(f"{gw.url}/healthz", 60):
        raise RuntimeError(f"{name} did not start:\n{proc.output()}")
    return gw


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Pair]:
    workdir = tmp_path_factory.mktemp("pair")
    prefix = new_prefix()
    database_url = f"sqlite+aiosqlite:///{workdir / 'tiergate.db'}"
    started: list[Gateway] = []
    configs: list[Path] = []
    try:
        for name in ("a", "b"):
            port, admin_port = free_port(), free_port()
            sub = workdir / name
            sub.mkdir()
            config = gateway_config(
                workdir=sub,
                redis_url=redis_url,
                prefix=prefix,
                database_url=database_url,
                sim_ports={},
                port=port,
                admin_port=admin_port,
            )
            configs.append(config)
            started.append(_start(config, sub, f"gateway-{name}", port, admin_port))
        yield Pair(started[0], started[1], configs[0], prefix)
    finally:
        for gw in started:
            gw.proc.stop()
        drop_prefix(redis_url, prefix)


# In-process apps on real services (SQLite in a temp dir, the test Redis), shared with the auth
# tests.
from tests.gateway.auth.conftest import (  # noqa: E402
    admin_client,
    public_client,
    services,
    settings,
)

__all__ = ["Gateway", "Pair", "admin_client", "pair", "public_client", "services", "settings"]
