"""The image's HEALTHCHECK script (deploy/docker/healthcheck.py) finds the health endpoint of
what the container runs — the gateway's or worker's admin port, or a simulator's own port —
and answers for a real simulator."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from types import ModuleType

from aiohttp import web

from backends.sim import PROFILES, create_sim_app
from tests.deploy.conftest import DEPLOY


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "healthcheck", DEPLOY / "docker" / "healthcheck.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TINI = ["/usr/bin/tini", "--", "python", "-m", "gateway.cli"]


def test_the_url_follows_the_command() -> None:
    url = _script().health_url
    sim = [*TINI, "sim", "--host", "0.0.0.0", "--port", "8000", "--profile", "gpt-4o-mini"]
    assert url(sim, {}) == "http://127.0.0.1:8000/health"
    assert url([*TINI, "sim", "--port=8101"], {}) == "http://127.0.0.1:8101/health"
    serve = [*TINI, "serve", "--config", "/etc/tiergate/config.yaml"]
    assert url(serve, {}) == "http://127.0.0.1:9464/healthz"
    assert url([*TINI, "worker"], {"TIERGATE_SERVER__ADMIN_PORT": "9500"}) == (
        "http://127.0.0.1:9500/healthz"
    )
    assert url(serve, {"TIERGATE_HEALTHCHECK_URL": "http://x/y"}) == "http://x/y"


def test_pid1_args_reads_a_nul_separated_command_line(tmp_path: Path) -> None:
    cmdline = tmp_path / "cmdline"
    cmdline.write_bytes(b"/usr/bin/tini\x00--\x00python\x00-m\x00gateway.cli\x00sim\x00")
    assert _script().pid1_args(str(cmdline))[-1] == "sim"
    assert _script().pid1_args(str(tmp_path / "none")) == []


async def test_a_running_simulator_is_healthy_and_a_closed_port_is_not() -> None:
    script = _script()
    runner = web.AppRunner(create_sim_app(PROFILES["gpt-4o-mini"], time_scale=0.0))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = script.health_url([*TINI, "sim", "--port", str(port)], {})
    try:
        assert await asyncio.to_thread(script.check, url) == 0
    finally:
        await runner.cleanup()
    assert script.check(url, timeout_s=0.5) == 1
