"""Real processes for tests: simulators, ``tiergate serve`` and ``tiergate worker``, a
redis-server of the test's own, a uvicorn server in a thread; each logs to a file that a failed
start shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn

from tests.support.configs import own_config
from tests.support.polling import wait_until
from tests.support.ports import free_port

__all__ = [
    "TEST_KEYS",
    "Proc",
    "RedisServer",
    "sim_faults",
    "start_gateway",
    "start_sim",
    "start_sims",
    "start_tiergate",
    "start_worker",
    "uvicorn_in_thread",
    "wait_http",
    "wait_ready",
    "wait_redis",
]

TEST_KEYS = {
    "TIERGATE_KEY_ACME": "test-key-acme-7f3a",
    "TIERGATE_KEY_GLOBEX": "test-key-globex-91bc",
    "TIERGATE_KEY_INITECH": "test-key-initech-44d0",
    "TIERGATE_ADMIN_KEY": "test-key-admin-0e11",
    "TIERGATE_FINANCE_KEY": "test-key-finance-5a2c",
}


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


def start_tiergate(command: str, config: Path, workdir: Path, name: str, *args: str) -> Proc:
    """``tiergate <command> --config <config> <args>`` with the test keys, logging to
    ``workdir/<name>.log``; not waited for."""
    argv = _tiergate(command, "--config", str(config), *args)
    return Proc(argv, workdir / f"{name}.log", TEST_KEYS)


def start_worker(config: Path, workdir: Path, name: str, *args: str) -> Proc:
    """``tiergate worker`` (workers and ledger sink) with an admin port of its own (an
    ``own_config`` in ``workdir/name``), so that several run beside an edge."""
    own = own_config(config, workdir, name, server={"admin_port": free_port()})
    return start_tiergate("worker", own, workdir, name, *args)


def sim_faults(url: str, **faults: Any) -> None:
    """Set a running simulator's faults (``hang=True``, ``error_status=503`` ...) through its
    ``/admin/faults``; none given: clear them. ``url``: the simulator's base URL."""
    request = urllib.request.Request(
        f"{url}/admin/faults",
        data=json.dumps(faults).encode(),
        method="POST" if faults else "DELETE",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200


def wait_redis(port: int, timeout_s: float = 10.0) -> None:
    """Wait until a redis-server on ``port`` answers ``PING``."""
    import redis

    client = redis.Redis(port=port, socket_connect_timeout=0.2)

    def answers() -> bool:
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    try:
        wait_until(answers, timeout_s, what=f"redis-server on {port} did not start")
    finally:
        client.close()


class RedisServer:
    """A redis-server of the test's own, on a free port, that the test may stop and restart."""

    def __init__(self, workdir: Path, *, aof: bool = False) -> None:
        """``aof``: with ``appendonly yes`` (fsync every second): a restart keeps its data."""
        self.port = free_port()
        self.workdir = workdir
        self.aof = aof
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes" if self.aof else "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_redis(self.port)

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
    wait_until(lambda: server.started, 10, what="uvicorn did not start")
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(10)
