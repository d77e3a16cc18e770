"""Running tiergate: the public and admin servers (and, unless disabled, workers) in one process."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import math
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Any

import uvicorn
from starlette.types import ASGIApp

from gateway.api.http_limits import limited_httptools
from gateway.app import create_admin_app, create_app
from gateway.services import Services, open_services
from gateway.settings import ServerSettings, Settings

__all__ = ["serve", "serve_worker"]

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signal handling to ``_run_servers`` (several share one loop)
    and says when it listens (``bound``: set once its socket is bound and its app started)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.bound = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)  # a port that cannot be bound exits here
        if self.started:
            self.bound.set()


ANSWER_S = 5.0
"""How long past the edge's drain uvicorn still waits for its requests: those still waiting are
answered 503 at the drain's end (``Dispatcher.stop_waiting``), and this is for writing those
answers and their rows. Only what is still running after it is cancelled."""


async def _run_servers(
    servers: Sequence[_Server],
    *,
    admin: _Server,
    listening: str | None = None,
    on_signal: Callable[[], None] | None = None,
    then: Callable[[float | None], Awaitable[None]] | None = None,
) -> None:
    """Run ``servers`` and the ``admin`` server until a signal or one of them ends; log
    ``listening`` once every one of them has bound its port (never when a bind failed: the
    process exits with an error). At the first SIGTERM/SIGINT, ``on_signal`` is called and
    ``servers`` stop (uvicorn's graceful shutdown: their requests finish); then ``then`` runs
    with the signal's time (``time.monotonic()``; ``None``: no signal came) while ``admin``
    still serves health and metrics through the whole drain, and only then ``admin`` stops."""
    signalled: list[float] = []
    came = asyncio.Event()

    def on_sig() -> None:
        if not signalled:
            signalled.append(time.monotonic())
            if on_signal is not None:
                on_signal()
        came.set()
        for server in servers:
            server.should_exit = True

    everything = [*servers, admin]
    with _signals_call(on_sig):
        tasks = [asyncio.create_task(s.serve()) for s in everything]
        try:
            if listening is not None:
                await _log_when_bound(everything, tasks, listening)
            signal_came = asyncio.create_task(came.wait())
            done, _pending = await asyncio.wait(
                [*tasks, signal_came], return_when=asyncio.FIRST_COMPLETED
            )
            if signal_came not in done:  # one server ending (its port taken) stops the others
                signal_came.cancel()
                for server in everything:
                    server.should_exit = True
            # The servers asked to stop finish their requests (uvicorn's graceful shutdown).
            stopping = [t for t, s in zip(tasks, everything, strict=True) if s.should_exit]
            if stopping:
                await asyncio.wait(stopping)
            for task in tasks:
                if task.done():
                    task.result()  # a server that failed (SystemExit when a bind failed)
            if then is not None:
                await then(signalled[0] if signalled else None)
        finally:
            admin.should_exit = True
            await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.contextmanager
def _signals_call(handler: Callable[[], None]) -> Generator[None, None, None]:
    """SIGINT and SIGTERM call ``handler`` on the running loop while inside."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, handler)
    try:
        yield
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def _log_when_bound(
    servers: Sequence[_Server], tasks: Sequence[asyncio.Task[None]], listening: str
) -> None:
    """Log ``listening`` once every server has bound its port; nothing if one ended first."""
    bound: asyncio.Future[Any] = asyncio.gather(*(s.bound.wait() for s in servers))
    await asyncio.wait([bound, *tasks], return_when=asyncio.FIRST_COMPLETED)
    if bound.done():
        log.warning("%s", listening)
    else:
        bound.cancel()


def _uvicorn_config(
    app: ASGIApp,
    host: str,
    port: int,
    *,
    max_header_bytes: int = 16 * 1024,
    keep_alive_s: int = 75,
    head_timeout_s: float = ServerSettings().head_timeout_s,
    body_timeout_s: float = ServerSettings().body_timeout_s,
    drain_s: float = 10.0,
) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http=limited_httptools(
            max_header_bytes, head_timeout_s=head_timeout_s, body_timeout_s=body_timeout_s
        ),
        h11_max_incomplete_event_size=max_header_bytes,
        lifespan="on",
        access_log=False,
        log_level="warning",
        timeout_graceful_shutdown=math.ceil(drain_s),
        timeout_keep_alive=keep_alive_s,
    )


def _admin_server(services: Services, settings: Settings) -> _Server:
    """The admin port's server (health, metrics, the admin API), alike in every process."""
    return _Server(
        _uvicorn_config(
            create_admin_app(services),
            settings.server.admin_host,
            settings.server.admin_port,
            max_header_bytes=settings.limits.max_header_bytes,
            head_timeout_s=settings.server.head_timeout_s,
            body_timeout_s=settings.server.body_timeout_s,
        )
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
                head_timeout_s=settings.server.head_timeout_s,
                body_timeout_s=settings.server.body_timeout_s,
                drain_s=settings.server.drain_s + ANSWER_S,
            )
        )
        admin = _admin_server(services, settings)
        freeze_startup_heap()
        listening = (
            f"tiergate listening on http://{settings.server.host}:{settings.server.port} "
            f"(admin {settings.server.admin_host}:{settings.server.admin_port})"
        )
        loop = asyncio.get_running_loop()

        def drain() -> None:  # at the end of the drain, answer what still waits
            loop.call_later(settings.server.drain_s, services.dispatcher.stop_waiting)

        await _run_servers(
            [public],
            admin=admin,
            listening=listening,
            on_signal=drain,
            then=functools.partial(_drain_worker, services, settings),
        )


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
        admin = _admin_server(services, settings)
        await _run_servers(
            [], admin=admin, then=functools.partial(_drain_worker, services, settings)
        )


async def _drain_worker(services: Services, settings: Settings, signalled: float | None) -> None:
    """Let this process's worker finish its jobs within ``queue.worker_drain_s`` of the signal
    (the edge's drain, in the same process, counts against it), then hand back the rest."""
    if services.worker is None:
        return
    elapsed = time.monotonic() - signalled if signalled is not None else 0.0
    await services.worker.aclose(drain_s=max(settings.queue.worker_drain_s - elapsed, 0.0))
