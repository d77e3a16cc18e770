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

from gateway.settings import SimulatorSettings, load_settings

__all__ = ["up"]

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
    return subprocess.Popen(args)  # noqa: S603


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
    procs = [_start_simulator(sim, time_scale) for sim in settings.simulators]
    try:
        for sim, proc in zip(settings.simulators, procs, strict=True):
            if not wait_http_ok(f"http://{sim.host}:{sim.port}/health", 30):
                code = proc.poll()
                typer.echo(
                    f"simulator {sim.profile} on port {sim.port} did not start ({code})", err=True
                )
                raise typer.Exit(1)
        _run_async(serve(settings, dev=True, workers=True))
    finally:
        stop_all(procs)
