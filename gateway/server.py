"""Running tiergate: the public and admin servers (and, unless disabled, workers) in one process."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Generator, Sequence

import uvicorn
from fastapi import FastAPI

from gateway.api.http_limits import limited_httptools
from gateway.app import create_admin_app, create_app
from gateway.services import open_services
from gateway.settings import Settings

__all__ = ["serve", "serve_worker"]

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signal handling to ``_run_servers`` (several share one loop)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


async def _run_servers(servers: Sequence[uvicorn.Server]) -> None:
    loop = asyncio.get_running_loop()

    def stop() -> None:
        for server in servers:
            server.should_exit = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)
    try:
        tasks = [asyncio.create_task(s.serve()) for s in servers]
        done, _pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        stop()  # one server ending (e.g. its port was taken) stops the others
        await asyncio.gather(*tasks, return_exceptions=True)
        for task in done:
            task.result()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def _uvicorn_config(
    app: FastAPI,
    host: str,
    port: int,
    *,
    max_header_bytes: int = 16 * 1024,
    keep_alive_s: int = 75,
) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http=limited_httptools(max_header_bytes),
        h11_max_incomplete_event_size=max_header_bytes,
        lifespan="on",
        access_log=False,
        log_level="warning",
        timeout_graceful_shutdown=10,
        timeout_keep_alive=keep_alive_s,
    )


async def serve(settings: Settings, *, dev: bool, workers: bool) -> None:
    async with open_services(settings, dev=dev, workers=workers) as services:
        public = _Server(
            _uvicorn_config(
                create_app(services=services),
                settings.server.host,
                settings.server.port,
                max_header_bytes=settings.limits.max_header_bytes,
                keep_alive_s=settings.server.keep_alive_s,
            )
        )
        admin = _Server(
            _uvicorn_config(
                create_admin_app(services),
                settings.server.admin_host,
                settings.server.admin_port,
                max_header_bytes=settings.limits.max_header_bytes,
            )
        )
        freeze_startup_heap()
        log.warning(
            "tiergate listening on http://%s:%d (admin %s:%d)",
            settings.server.host,
            settings.server.port,
            settings.server.admin_host,
            settings.server.admin_port,
        )
        await _run_servers([public, admin])


def freeze_startup_heap() -> None:
    """Move everything alive after start-up (modules, the classifier, settings: most of the
    heap) out of the garbage collector's view. Its full collections otherwise walk all of it,
    pausing the event loop for a long time (100-200 ms were seen under load). Young collections
    run every 20,000 allocations instead of 700: a request allocates thousands of short-lived
    objects. In one quick open-loop run at 300 requests/s on one core the added p99 went from
    1.3 s to 9.5 ms; the full bench (docs/bench.md) then measured 36 ms."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 50, 100)


async def serve_worker(
    settings: Settings, *, dev: bool, workers: bool = True, sink: bool = True
) -> None:
    """Workers and the ledger sink (or either alone), plus the admin port for metrics and
    health."""
    async with open_services(settings, dev=dev, workers=workers, sink=sink) as services:
        freeze_startup_heap()
        admin = _Server(
            _uvicorn_config(
                create_admin_app(services),
                settings.server.admin_host,
                settings.server.admin_port,
                max_header_bytes=settings.limits.max_header_bytes,
            )
        )
        await _run_servers([admin])
