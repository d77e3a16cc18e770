"""``tiergate up``: the simulators a config names, then the gateway, in the foreground."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Annotated

import typer

from gateway.cli.ports import Endpoint, stack_endpoints, taken
from gateway.settings import Settings, SimulatorSettings, load_settings

__all__ = ["banner", "ports_taken_message", "stop_all", "up", "wait_http_ok"]

log = logging.getLogger(__name__)


def _start_simulator(sim: SimulatorSettings, time_scale: float | None) -> subprocess.Popen[bytes]:
    args = [
        sys.executable, "-m", "gateway.cli", "sim",
        "--profile", sim.profile,
        "--port", str(sim.port),
        "--host", sim.host,
        "--time-scale", str(sim.time_scale if time_scale is None else time_scale),
    ]  # fmt: skip
    if sim.usage_log is not None:
        args += ["--usage-log", str(sim.usage_log)]
    # Its own session: Ctrl-C reaches only ``up``, which stops the simulators once the
    # gateway has finished what it was answering (``stop_all``).
    return subprocess.Popen(args, start_new_session=True)  # noqa: S603


def wait_http_ok(url: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:  # noqa: S310
                if response.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    return False


def ports_taken_message(busy: list[Endpoint]) -> str:
    where = ", ".join(str(endpoint) for endpoint in busy)
    return (
        f"tiergate: port{'s' if len(busy) > 1 else ''} already in use: {where}. Stop what "
        "listens there, or use a config whose server and simulators are on free ports."
    )


def stop_all(procs: list[subprocess.Popen[bytes]], timeout_s: float = 5.0) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def banner(settings: Settings) -> str:
    """What ``up`` prints once its simulators answer: where to point clients and people."""
    server = settings.server
    base = f"http://{server.host}:{server.port}"
    return "\n".join(
        (
            f"tiergate: API          {base}/v1  (OpenAI-compatible; dev keys dev-acme, ...)",
            f"tiergate: costs        {base}/dashboard",
            f"tiergate: rules        {base}/dashboard/rules  (see, try and change routing rules)",
            f"tiergate: metrics      http://{server.admin_host}:{server.admin_port}/metrics",
        )
    )


def up(
    config: Annotated[Path, typer.Option("--config", "-c", exists=True, help="YAML config")],
    time_scale: Annotated[
        float | None, typer.Option(help="override every simulator's latency multiplier")
    ] = None,
) -> None:
    """Start the config's simulators and `tiergate serve --dev`; Ctrl-C or SIGTERM stops all."""
    from gateway.cli.main import _run_async, configure_logging
    from gateway.server import serve

    configure_logging()
    settings = load_settings(config)
    busy = taken(stack_endpoints(settings))
    if busy:
        typer.echo(ports_taken_message(busy), err=True)
        raise typer.Exit(1)
    procs = [_start_simulator(sim, time_scale) for sim in settings.simulators]
    try:
        for sim, proc in zip(settings.simulators, procs, strict=True):
            # its own: the process started must still run once the port answers
            ready = wait_http_ok(f"http://{sim.host}:{sim.port}/health", 30)
            if not ready or proc.poll() is not None:
                code = proc.poll()
                typer.echo(
                    f"simulator {sim.profile} on port {sim.port} did not start ({code})", err=True
                )
                raise typer.Exit(1)
        typer.echo(banner(settings))
        _run_async(serve(settings, dev=True, workers=True))
    finally:
        stop_all(procs)
