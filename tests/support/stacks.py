"""The whole stack as real processes, for end-to-end tests: a simulator per profile, ``tiergate
serve`` over them (optionally as an edge only, beside ``tiergate worker`` processes), the real
Redis under a key prefix of its own, a SQLite ledger; everything stopped, and the prefix's keys
deleted, on exit."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import redis

from tests.support.configs import edit_config, gateway_config
from tests.support.ports import free_port
from tests.support.procs import (
    TEST_KEYS,
    Proc,
    RedisServer,
    sim_faults,
    start_gateway,
    start_sim,
    start_worker,
    wait_ready,
)

__all__ = ["PROFILES", "Stack", "drop_prefix", "new_prefix", "stack_with_own_redis"]

PROFILES = ("llama-3.1-8b-instruct", "llama-3.1-70b-instruct-awq", "gpt-4o-mini")


def new_prefix() -> str:
    """A Redis key prefix of the test's own (``drop_prefix`` deletes its keys)."""
    return f"tgtest-{uuid.uuid4().hex[:10]}"


def drop_prefix(redis_url: str, prefix: str) -> None:
    """Delete every key under ``prefix`` (what a test or a stack wrote)."""
    client = redis.Redis.from_url(redis_url)
    try:
        for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            client.delete(key)
    finally:
        client.close()


@dataclass
class Stack:
    """A running stack (made by ``Stack.run``); a test module may subclass it for helpers of
    its own and run that."""

    base_url: str
    admin_url: str
    database_url: str
    config: Path
    workdir: Path
    prefix: str
    redis_url: str
    sim_ports: dict[str, int]
    usage_logs: dict[str, Path]
    sims: dict[str, Proc]
    gateway: Proc
    workers: list[Proc] = field(default_factory=list)

    def key(self, tenant: str) -> str:
        return TEST_KEYS[f"TIERGATE_KEY_{tenant.upper()}"]

    def sim_url(self, profile: str) -> str:
        return f"http://127.0.0.1:{self.sim_ports[profile]}"

    def faults(self, profile: str, **faults: Any) -> None:
        """Set the simulator's faults (none given: clear them)."""
        sim_faults(self.sim_url(profile), **faults)

    def start_worker(self, name: str, *extra_args: str) -> Proc:
        """One more ``tiergate worker`` on the stack's config, stopped with the stack."""
        proc = start_worker(self.config, self.workdir, name, *extra_args)
        self.workers.append(proc)
        return proc

    @classmethod
    @contextmanager
    def run(
        cls,
        workdir: Path,
        redis_url: str,
        profiles: Sequence[str] = PROFILES,
        *,
        edit: Callable[[dict[str, Any]], None] | None = None,
        sim_args: Mapping[str, Sequence[str]] | None = None,
        time_scale: float = 0.05,
        edge_only: bool = False,
        workers: Sequence[str] = (),
        **config: Any,
    ) -> Iterator[Self]:
        """``config``: top-level config sections (``fallback=...``), then ``edit`` may change
        the config's data; ``sim_args``: extra ``tiergate sim`` arguments by profile;
        ``edge_only``: ``serve --no-workers``, with a ``tiergate worker`` per name in
        ``workers`` (started before the edge is ready, not waited for)."""
        prefix = new_prefix()
        sims: dict[str, Proc] = {}
        usage: dict[str, Path] = {}
        ports = {profile: free_port() for profile in profiles}
        running: Self | None = None
        try:
            for profile, sim_port in ports.items():
                sims[profile], usage[profile] = start_sim(
                    profile, sim_port, workdir, time_scale=time_scale,
                    extra_args=(sim_args or {}).get(profile, ()),
                )  # fmt: skip
            port, admin_port = free_port(), free_port()
            database_url = f"sqlite+aiosqlite:///{workdir / 'ledger.db'}"
            path = gateway_config(
                workdir=workdir, redis_url=redis_url, prefix=prefix, database_url=database_url,
                sim_ports=ports, port=port, admin_port=admin_port, **config,
            )  # fmt: skip
            if edit is not None:
                edit_config(path, edit)
            gateway = start_gateway(path, workdir, *(["--no-workers"] if edge_only else []))
            running = cls(
                base_url=f"http://127.0.0.1:{port}",
                admin_url=f"http://127.0.0.1:{admin_port}",
                database_url=database_url,
                config=path,
                workdir=workdir,
                prefix=prefix,
                redis_url=redis_url,
                sim_ports=ports,
                usage_logs=usage,
                sims=sims,
                gateway=gateway,
            )
            for name in workers:
                running.start_worker(name)
            wait_ready(gateway, f"{running.base_url}/readyz")
            yield running
        finally:
            if running is not None:
                for proc in reversed(running.workers):
                    proc.stop()
                running.gateway.stop()
            for proc in sims.values():
                proc.stop()
            drop_prefix(redis_url, prefix)


@contextmanager
def stack_with_own_redis(
    workdir: Path, profile: str, *, edit: Callable[[dict[str, Any]], None] | None = None
) -> Iterator[tuple[RedisServer, str, str]]:
    """A simulator of ``profile`` and a ``tiergate serve`` on a redis-server of the test's own
    (no persistence: the test may stop it, or restart it empty) and a SQLite ledger; ``edit``
    may change the config first. Yields that Redis, the gateway's base URL and the ledger's
    database URL."""
    redis_server = RedisServer(workdir)
    redis_server.start()
    procs: list[Proc] = []
    try:
        sim_port = free_port()
        sim, _usage = start_sim(profile, sim_port, workdir)
        procs.append(sim)
        port = free_port()
        database_url = f"sqlite+aiosqlite:///{workdir / 'ledger.db'}"
        config = gateway_config(
            workdir=workdir,
            redis_url=redis_server.url,
            prefix="tgtest",
            database_url=database_url,
            sim_ports={profile: sim_port},
            port=port,
            admin_port=free_port(),
        )
        if edit is not None:
            edit_config(config, edit)
        gateway = start_gateway(config, workdir)
        procs.append(gateway)
        wait_ready(gateway, f"http://127.0.0.1:{port}/readyz")
        yield redis_server, f"http://127.0.0.1:{port}", database_url
    finally:
        for proc in reversed(procs):
            proc.stop()
        redis_server.stop()
