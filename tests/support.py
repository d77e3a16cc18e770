"""Helpers for tests that run real processes: free ports, simulators, the gateway."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
import yaml

__all__ = [
    "TEST_KEYS",
    "Proc",
    "RedisServer",
    "free_port",
    "gateway_config",
    "start_gateway",
    "start_sim",
    "wait_http",
    "wait_ready",
]

TEST_KEYS = {
    "TIERGATE_KEY_ACME": "test-key-acme-7f3a",
    "TIERGATE_KEY_GLOBEX": "test-key-globex-91bc",
    "TIERGATE_KEY_INITECH": "test-key-initech-44d0",
    "TIERGATE_ADMIN_KEY": "test-key-admin-0e11",
    "TIERGATE_FINANCE_KEY": "test-key-finance-5a2c",
}


def fuzz_examples(full: int) -> int:
    """How many generated examples a slow fuzz or property test runs: ``full`` times
    ``TIERGATE_FUZZ_SCALE`` (default 1; lower it for a shorter pass), at least 1."""
    return max(1, round(full * float(os.environ.get("TIERGATE_FUZZ_SCALE", "1"))))


_PORTS = (20_000, 32_000)
"""Where test servers listen: below Linux's ephemeral range (32768-60999), which the kernel
hands to outgoing connections. A port the kernel picks for us (bind to 0) comes from that range,
and between our check and the server's bind an outgoing connection of another test could take
it ("address already in use", seen in CI)."""


def free_port() -> int:
    """A port nothing listens on now, outside the ephemeral range; random, so parallel test
    processes rarely pick the same one."""
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(*_PORTS)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # a crowded range
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(url: str, timeout_s: float = 30.0, *, status: int = 200) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == status:
                    return True
        except urllib.error.HTTPError as exc:
            if exc.code == status:
                return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    return False


class Proc:
    """A child process whose output goes to a log file (shown when a test fails to start it)."""

    def __init__(self, args: list[str], log: Path, env: Mapping[str, str] | None = None) -> None:
        self.log = log
        self._out = log.open("wb")
        full_env = {**os.environ, **(env or {})}
        self.popen = subprocess.Popen(
            args, stdout=self._out, stderr=subprocess.STDOUT, env=full_env
        )

    def output(self) -> str:
        self._out.flush()
        return self.log.read_text(errors="replace")

    def stop(self, timeout_s: float = 10.0) -> int:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._out.close()
        return self.popen.returncode


def _tiergate(*args: str) -> list[str]:
    return [sys.executable, "-m", "gateway.cli", *args]


def start_sim(
    profile: str,
    port: int,
    workdir: Path,
    *,
    time_scale: float = 0.05,
    extra_args: Sequence[str] = (),
    usage_log: bool = True,
) -> tuple[Proc, Path]:
    """``extra_args`` go to ``tiergate sim`` (e.g. ``--itl-ms``); ``usage_log=False`` writes none
    (the returned path then does not exist)."""
    usage = workdir / f"usage-{profile}.jsonl"
    log_args = ["--usage-log", str(usage)] if usage_log else []
    proc = Proc(
        _tiergate(
            "sim", "--profile", profile, "--port", str(port),
            "--time-scale", str(time_scale), *log_args, *extra_args,
        ),
        workdir / f"sim-{profile}.log",
    )  # fmt: skip
    if not wait_http(f"http://127.0.0.1:{port}/health", 30):
        raise RuntimeError(f"simulator {profile} did not start:\n{proc.output()}")
    return proc, usage


def start_sims(
    profiles: Sequence[str],
    workdir: Path,
    procs: list[Proc],
    *,
    extra_args: Mapping[str, Sequence[str]] | None = None,
) -> tuple[dict[str, int], dict[str, Path]]:
    """One simulator per profile on a free port, each appended to ``procs`` as it starts (the
    caller stops them); their ports and usage logs by profile. ``extra_args``: per profile."""
    ports = {profile: free_port() for profile in profiles}
    usage: dict[str, Path] = {}
    for profile, port in ports.items():
        proc, log = start_sim(
            profile, port, workdir, extra_args=(extra_args or {}).get(profile, ())
        )
        procs.append(proc)
        usage[profile] = log
    return ports, usage


def gateway_config(
    *,
    workdir: Path,
    redis_url: str,
    prefix: str,
    database_url: str,
    sim_ports: Mapping[str, int],
    port: int,
    admin_port: int,
    **extra: Any,
) -> Path:
    """A config like deploy/config.example.yaml, on the given ports and stores, with only the
    deployments that have a simulator in ``sim_ports``."""
    example = Path(__file__).resolve().parents[1] / "deploy" / "config.example.yaml"
    config = yaml.safe_load(example.read_text())
    config["server"] = {"host": "127.0.0.1", "port": port, "admin_port": admin_port}
    config["redis"] = {"url": redis_url, "key_prefix": prefix}
    config["database"] = {"url": database_url}
    config.pop("simulators", None)
    config["deployments"] = [d for d in config["deployments"] if d["model"] in sim_ports]
    for tenant in config["tenants"].values():
        if tenant.get("baseline_model") not in sim_ports:
            tenant.pop("baseline_model", None)
    for dep in config["deployments"]:
        sim_port = sim_ports[dep["model"]]
        suffix = "/v1" if dep["provider"] == "litellm" else ""
        dep["replicas"][0]["url"] = f"http://127.0.0.1:{sim_port}{suffix}"
    for key, value in extra.items():
        config[key] = value
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def wait_ready(proc: Proc, url: str, timeout_s: float = 60.0) -> None:
    """Wait for ``url`` to answer 200; fail at once, with the log, if the process exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"process exited with {proc.popen.returncode}:\n{proc.output()}")
        if wait_http(url, 0.5):
            return
    raise RuntimeError(f"{url} not ready after {timeout_s}s:\n{proc.output()}")


def start_gateway(
    config: Path,
    workdir: Path,
    *extra_args: str,
    name: str = "gateway",
    launcher: Sequence[str] = (),
) -> Proc:
    """``launcher`` runs before the command and must exec it (e.g. ``taskset -c 1``)."""
    proc = Proc(
        [*launcher, *_tiergate("serve", "--config", str(config), *extra_args)],
        workdir / f"{name}.log",
        TEST_KEYS,
    )
    return proc


class RedisServer:
    """A redis-server of the test's own, on a free port, that the test may stop and restart."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import redis

        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    time.sleep(0.05)
            raise RuntimeError("redis-server did not start")
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


@contextmanager
def uvicorn_in_thread(config: uvicorn.Config) -> Iterator[None]:
    """A real uvicorn server on ``config``, in a thread of the test's process, until the block
    ends (the test's own small ASGI app, where a whole ``tiergate serve`` is not needed)."""
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(10)


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
            data = yaml.safe_load(config.read_text())
            edit(data)
            config.write_text(yaml.safe_dump(data))
        gateway = start_gateway(config, workdir)
        procs.append(gateway)
        wait_ready(gateway, f"http://127.0.0.1:{port}/readyz")
        yield redis_server, f"http://127.0.0.1:{port}", database_url
    finally:
        for proc in reversed(procs):
            proc.stop()
        redis_server.stop()
