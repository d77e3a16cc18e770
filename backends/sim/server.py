"""The simulator app: routes, the app factory and the blocking runner.

Routes::

    POST   /v1/chat/completions   the chat API (``backends.sim.chat``)
    GET    /v1/models             the served model (vLLM's shape, with ``max_model_len``)
    GET    /health                200, or 503 while the ``unhealthy`` fault is on (empty bodies)
    GET    /metrics               Prometheus text (``backends.sim.metrics``)
    GET    /admin/faults          the active faults (``{}`` when none)
    POST   /admin/faults          replace them (``backends.sim.faults``)
    DELETE /admin/faults          clear them

A real hosted API has neither ``/health`` nor ``/metrics``; the OpenAI-flavoured profile serves
them anyway, for tests.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from backends.sim.chat import chat_completions
from backends.sim.embeddings import embeddings
from backends.sim.engine import SimEngine
from backends.sim.errors import SimError, error_response
from backends.sim.faults import Faults, FaultSwitch, InvalidFaults
from backends.sim.metrics import SimMetrics, make_registry, render_metrics
from backends.sim.profiles import PROFILES, SimProfile
from backends.sim.state import SIM_STATE, SimState
from backends.sim.usage_log import UsageLog

__all__ = ["create_sim_app", "run_sim"]

logger = logging.getLogger(__name__)

_MAX_BODY_BYTES = 64 * 1024 * 1024  # a 128k-token prompt is well under this


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data), content_type="application/json")


def _model_card(profile: SimProfile, created: int) -> dict[str, Any]:
    if profile.flavor == "openai":
        return {"id": profile.name, "object": "model", "created": created, "owned_by": "system"}
    return {
        "id": profile.name,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": profile.name,
        "parent": None,
        "max_model_len": profile.max_model_len,
        "permission": [
            {
                "id": f"modelperm-{profile.name}",
                "object": "model_permission",
                "created": created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }


async def _models(request: web.Request) -> web.Response:
    profile = request.app[SIM_STATE].profile
    return _json({"object": "list", "data": [_model_card(profile, int(time.time()))]})


async def _health(request: web.Request) -> web.Response:
    unhealthy = request.app[SIM_STATE].faults.current.unhealthy
    return web.Response(status=503 if unhealthy else 200)


async def _metrics(request: web.Request) -> web.Response:
    body = render_metrics(request.app[SIM_STATE].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _get_faults(request: web.Request) -> web.Response:
    return _json(request.app[SIM_STATE].faults.current.to_json())


async def _set_faults(request: web.Request) -> web.Response:
    state = request.app[SIM_STATE]
    try:
        faults = Faults.from_json(orjson.loads(await request.read()))
    except (orjson.JSONDecodeError, InvalidFaults) as exc:
        return error_response(state.profile.flavor, SimError(400, str(exc)))
    state.faults.set(faults)
    logger.info("faults set: %s", faults.to_json())
    return _json(faults.to_json())


async def _clear_faults(request: web.Request) -> web.Response:
    request.app[SIM_STATE].faults.set(Faults())
    return _json({})


async def _lifespan(app: web.Application) -> AsyncIterator[None]:
    state = app[SIM_STATE]
    state.usage.open()
    yield
    state.usage.close()


async def _release_held(app: web.Application) -> None:
    app[SIM_STATE].faults.release_all()


def create_sim_app(
    profile: SimProfile,
    *,
    time_scale: float = 1.0,
    usage_log: Path | None = None,
    seed: int = 0,
    ttft_ms: float | None = None,
    itl_ms: float | None = None,
) -> web.Application:
    """A simulator for ``profile``. ``time_scale`` multiplies every modelled latency (0 = none);
    ``usage_log`` is a JSONL file appended to; ``seed`` seeds the fault draws. ``ttft_ms`` and
    ``itl_ms`` fix the time to first token and the inter-token latency in wall-clock
    milliseconds (not scaled, no load slowdown), e.g. a paced stream at ``time_scale=0``."""
    if not (math.isfinite(time_scale) and time_scale >= 0):
        raise ValueError(f"time_scale must be a finite number >= 0, got {time_scale!r}")
    for name, value in (("ttft_ms", ttft_ms), ("itl_ms", itl_ms)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    engine = SimEngine(profile)
    metrics = SimMetrics()
    state = SimState(
        profile=profile,
        time_scale=time_scale,
        engine=engine,
        metrics=metrics,
        registry=make_registry(profile.name, engine, metrics),
        faults=FaultSwitch(),
        rng=random.Random(seed),
        usage=UsageLog(usage_log),
        ttft_override_s=None if ttft_ms is None else ttft_ms / 1e3,
        itl_override_s=None if itl_ms is None else itl_ms / 1e3,
    )
    app = web.Application(client_max_size=_MAX_BODY_BYTES)
    app[SIM_STATE] = state
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/admin/faults", _get_faults)
    app.router.add_post("/admin/faults", _set_faults)
    app.router.add_delete("/admin/faults", _clear_faults)
    app.cleanup_ctx.append(_lifespan)
    app.on_shutdown.append(_release_held)
    return app


def run_sim(
    profile_name: str,
    *,
    host: str = "127.0.0.1",
    port: int,
    time_scale: float = 1.0,
    usage_log: Path | None = None,
    ttft_ms: float | None = None,
    itl_ms: float | None = None,
    max_num_seqs: int | None = None,
    enable_prefix_caching: bool | None = None,
) -> None:
    """Serve ``profile_name`` until SIGINT/SIGTERM (blocking). No access log, for speed.
    ``max_num_seqs`` and ``enable_prefix_caching`` override the profile's (None: keep them); see
    ``create_sim_app`` for the rest."""
    try:
        profile = PROFILES[profile_name]
    except KeyError:
        raise ValueError(
            f"unknown simulator profile {profile_name!r}; known: {', '.join(PROFILES)}"
        ) from None
    if max_num_seqs is not None:
        profile = dataclasses.replace(profile, max_num_seqs=max_num_seqs)
    if enable_prefix_caching is not None:
        profile = dataclasses.replace(profile, enable_prefix_caching=enable_prefix_caching)
    app = create_sim_app(
        profile, time_scale=time_scale, usage_log=usage_log, ttft_ms=ttft_ms, itl_ms=itl_ms
    )
    logger.info(
        "simulating %s on http://%s:%d (time_scale=%g, prefix caching %s)",
        profile.name,
        host,
        port,
        time_scale,
        "on" if profile.enable_prefix_caching else "off",
    )
    web.run_app(
        app,
        host=host,
        port=port,
        print=None,
        access_log=None,
        shutdown_timeout=5.0,
        handle_signals=True,
    )
