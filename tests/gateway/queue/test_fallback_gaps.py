"""Fallback without gaps, on the executor: a continuation refused by the next deployment goes
to the one after it (or ends naming the cut); a silent deployment leaves room for the rest of
the plan; the last deployment left is not held to first-token, first-byte or stall limits; a
continued answer keeps one ``model`` and reports the request's summed usage; retry waits are
counted apart from the gateway's own time; and the client's error keeps the status the
failure means (400 for a context window, 429 with its ``Retry-After``) and the provider's own
code, never the replica's internal name. Real HTTP (simulators), real Redis slot leases."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from backends.openai_http import VLLMBackend
from backends.sim import PROFILES, create_sim_app
from gateway.accounting.prices import PriceBook
from gateway.faults.chains import TierFaults
from gateway.faults.policy import RetryPolicy
from gateway.queue.keys import RedisKeys
from gateway.queue.replicas.capacity import SlotLeases
from gateway.queue.replicas.pool import BackendPool, Replica
from gateway.queue.running.executor import Executor
from router.catalog import Catalog, DeploymentSpec, Tier
from tests.gateway.queue.conftest import (
    MODEL,
    bare_executor,
    outcomes,
    plan_job,
    reply_text,
    run_job,
)

HOSTED = "gpt-4o-mini"
FAST = TierFaults(
    retry=RetryPolicy(max_attempts=2, backoff_initial_s=0.01, jitter_s=0.0),
    attempt_s=20.0,
    first_token_s=0.5,
    first_byte_s=0.5,
)
"""What the wiring makes of a tier with 0.5 s first-token and first-byte limits."""


@dataclasses.dataclass
class Rig:
    make: Callable[..., Awaitable[Executor]]
    faults: Callable[..., Awaitable[None]]


@pytest.fixture
async def rig(redis_url: str, key_prefix: str) -> AsyncIterator[Rig]:
    """``make({name: profile}, specs=...)``: one simulator per name (``profile``: the 8B's, or
    ``HOSTED`` for OpenAI's dialect), an executor over them; ``faults(name, **faults)``."""
    runners: list[web.AppRunner] = []
    urls: dict[str, str] = {}
    redis = aioredis.Redis.from_url(redis_url)
    session = aiohttp.ClientSession()
    pools: list[BackendPool] = []

    async def make(
        sims: dict[str, str],
        *,
        specs: dict[str, dict[str, Any]] | None = None,
        tier: TierFaults = FAST,
        backend_s: float = 0.5,
    ) -> Executor:
        keys = RedisKeys(key_prefix)
        for name, base in sims.items():
            profile = dataclasses.replace(PROFILES[base], name=name, itl_s=0)
            runner = web.AppRunner(create_sim_app(profile, time_scale=0.0))
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            runners.append(runner)
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            urls[name] = f"http://127.0.0.1:{port}"
        pool = BackendPool(
            {
                name: [
                    Replica(
                        VLLMBackend(
                            name=f"{name}#0", base_url=urls[name], session=session,
                            first_token_s=backend_s, stall_s=backend_s, first_byte_s=backend_s,
                        ),
                        4,
                        slot_key=keys.slots("small", f"{name}#0"),
                    )
                ]
                for name in sims
            },
            leases=SlotLeases(redis),
            owner="w1",
        )  # fmt: skip
        pool.start()
        pools.append(pool)
        extra = specs or {}
        catalog = Catalog(
            tuple(
                DeploymentSpec(
                    model=name, tier=Tier.SMALL, max_model_len=16384,
                    provider="litellm" if base == HOSTED else "vllm", **extra.get(name, {}),
                )
                for name, base in sims.items()
            )
        )  # fmt: skip
        return bare_executor(pool, catalog, PriceBook({}), faults={Tier.SMALL: tier})

    async def faults(name: str, **faults: Any) -> None:
        async with session.post(f"{urls[name]}/admin/faults", json=faults) as response:
            assert response.status == 200, await response.text()

    yield Rig(make, faults)
    for name in urls:  # release held (``hang``) requests before the servers stop
        async with session.delete(f"{urls[name]}/admin/faults"):
            pass
    for pool in pools:
        await pool.aclose()
    for runner in runners:
        await runner.cleanup()
    await session.close()
    await redis.aclose()


# -- 1. a refused continuation ----------------------------------------------------------------


async def test_a_refused_continuation_goes_on_to_the_next_choice(rig: Rig) -> None:
    executor = await rig.make({"cut": MODEL, "refuser": MODEL, "wide": MODEL})
    await rig.faults("cut", cut_after_tokens=10)
    await rig.faults("refuser", refuses_prefill=True)
    entry, replies = await run_job(executor, plan_job("cut", "refuser", "wide", stream=True))
    assert outcomes(entry) == [("cut", "stream_cut"), ("refuser", "rejected"), ("wide", "ok")]
    assert (entry.outcome, entry.deployment) == ("ok", "wide")
    assert replies[-1].kind == "end"  # a clean end: one answer, no error event


async def test_a_refused_continuation_with_nowhere_to_go_names_the_cut(rig: Rig) -> None:
    executor = await rig.make({"cut": MODEL, "refuser": MODEL})
    await rig.faults("cut", cut_after_tokens=10)
    await rig.faults("refuser", refuses_prefill=True)
    entry, replies = await run_job(executor, plan_job("cut", "refuser", stream=True))
    assert entry.outcome == "stream_error"
    assert replies[-1].kind == "error"
    message = replies[-1].data["error"]["message"]
    assert "stream" in message and "cut" in message, message
    assert "prefill" not in message and "#0" not in message, message


async def test_a_deployment_that_does_not_accept_continuation_is_passed_over(rig: Rig) -> None:
    executor = await rig.make(
        {"cut": MODEL, "refuser": MODEL, "wide": MODEL},
        specs={"refuser": {"accepts_continuation": False}},
    )
    await rig.faults("cut", cut_after_tokens=10)
    await rig.faults("refuser", refuses_prefill=True)
    entry, _ = await run_job(executor, plan_job("cut", "refuser", "wide", stream=True))
    assert outcomes(entry) == [("cut", "stream_cut"), ("wide", "ok")]  # never asked


async def test_a_stream_that_broke_before_any_text_restarts_on_a_refuser(rig: Rig) -> None:
    """Nothing but the opening chunk reached the client: the next deployment answers from
    scratch (no prefill to refuse), and the client gets one whole answer."""
    executor = await rig.make({"cut": MODEL, "refuser": MODEL})
    await rig.faults("cut", cut_after_tokens=0)
    await rig.faults("refuser", refuses_prefill=True)
    entry, replies = await run_job(executor, plan_job("cut", "refuser", stream=True))
    assert outcomes(entry)[-1] == ("refuser", "ok") and entry.outcome == "ok"
    assert reply_text(replies)


# -- 2. a silent deployment, non-streamed -------------------------------------------------------


async def test_a_silent_deployment_leaves_time_for_the_rest_of_the_plan(rig: Rig) -> None:
    """The tier's per-attempt budget (20 s) is longer than the request's deadline (3 s): the
    silent primary may wait only a share of it, and the next deployment answers in time."""
    slow = dataclasses.replace(FAST, first_byte_s=60.0)
    executor = await rig.make({"silent": MODEL, "ok": MODEL}, tier=slow, backend_s=60.0)
    await rig.faults("silent", hang=True)
    started = time.monotonic()
    entry, replies = await run_job(executor, plan_job("silent", "ok", timeout_s=3.0))
    assert outcomes(entry) == [("silent", "timeout"), ("ok", "ok")]
    assert replies[-1].kind == "result" and time.monotonic() - started < 2.5


async def test_a_non_streamed_call_has_a_first_byte_limit(rig: Rig) -> None:
    executor = await rig.make({"silent": MODEL, "ok": MODEL}, backend_s=60.0)
    await rig.faults("silent", hang=True)
    started = time.monotonic()
    entry, _ = await run_job(executor, plan_job("silent", "ok"))
    assert outcomes(entry) == [("silent", "timeout"), ("ok", "ok")]
    assert time.monotonic() - started < 2.0  # FAST's 0.5 s first byte, not the 20 s attempt


# -- 6. the last deployment left ------------------------------------------------------------


@pytest.mark.parametrize(
    "fault",
    [{"slow_first_token_ms": 1200}, {"stall_after_tokens": 5, "stall_ms": 1200}],
    ids=["first-token", "stall"],
)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_the_last_deployment_left_is_not_cut_by_its_first_token_or_stall_limit(
    rig: Rig, fault: dict[str, Any], stream: bool
) -> None:
    """A slow but working answer with nowhere else to go is an answer, not a 502."""
    executor = await rig.make({"slow": MODEL})
    await rig.faults("slow", **fault)
    entry, replies = await run_job(executor, plan_job("slow", stream=stream))
    assert outcomes(entry) == [("slow", "ok")] and entry.outcome == "ok"
    assert replies[-1].kind in ("result", "end")


async def test_a_deployment_with_others_left_is_still_held_to_its_limits(rig: Rig) -> None:
    executor = await rig.make({"slow": MODEL, "ok": MODEL})
    await rig.faults("slow", slow_first_token_ms=1200)
    entry, _ = await run_job(executor, plan_job("slow", "ok", stream=True))
    assert outcomes(entry) == [("slow", "timeout"), ("ok", "ok")]


async def test_retry_waits_are_reported_apart_from_backend_time(rig: Rig) -> None:
    executor = await rig.make({"limited": MODEL, "ok": MODEL})
    await rig.faults("limited", rate_limit=True, retry_after=0.3)
    entry, replies = await run_job(executor, plan_job("limited", "ok"))
    assert outcomes(entry) == [("limited", "rate_limited"), ("limited", "rate_limited"),
                               ("ok", "ok")]  # fmt: skip
    assert replies[-1].meta.wait_ms >= 300  # the edge takes it out of the overhead


# -- 5. one answer after a continuation ------------------------------------------------------


async def test_a_continued_stream_keeps_one_model_and_reports_the_summed_usage(
    rig: Rig,
) -> None:
    executor = await rig.make({"cut": MODEL, "wide": MODEL})
    await rig.faults("cut", cut_after_tokens=10)
    entry, replies = await run_job(
        executor, plan_job("cut", "wide", stream=True, stream_options={"include_usage": True})
    )
    assert outcomes(entry) == [("cut", "stream_cut"), ("wide", "ok")]
    chunks = [r.data for r in replies if r.kind == "chunk"]
    assert {c["model"] for c in chunks} == {"cut"}  # as the first chunk (and header) said
    assert len({c["id"] for c in chunks}) == 1
    (usage,) = [c["usage"] for c in chunks if c.get("usage")]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (
        entry.prompt_tokens,
        entry.completion_tokens,
    )  # what the ledger books: both attempts
    assert usage["total_tokens"] == entry.prompt_tokens + entry.completion_tokens
    assert replies[-1].meta.served_by == ("cut", "wide")


# -- 4. the client's error -------------------------------------------------------------------


async def test_a_context_window_with_nowhere_else_to_go_is_a_400(rig: Rig) -> None:
    executor = await rig.make({"narrow": MODEL})
    entry, replies = await run_job(executor, plan_job("narrow", max_tokens=20_000))
    (reply,) = replies
    assert (reply.kind, reply.meta.status) == ("error", 400)
    assert reply.data["error"]["code"] == "context_length_exceeded"
    assert entry.status_code == 400 and "#0" not in reply.data["error"]["message"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_persistent_429_stays_a_429_with_its_retry_after(rig: Rig, stream: bool) -> None:
    executor = await rig.make({"limited": MODEL})
    await rig.faults("limited", rate_limit=True, retry_after=0.2)
    entry, replies = await run_job(executor, plan_job("limited", stream=stream))
    reply = replies[-1]
    assert (reply.kind, reply.meta.status) == ("error", 429)
    assert reply.meta.retry_after == pytest.approx(0.2)
    assert reply.data["error"]["code"] == "rate_limit_exceeded"
    assert entry.status_code == 429 and "#0" not in reply.data["error"]["message"]


async def test_a_rejection_keeps_the_providers_own_code(rig: Rig) -> None:
    executor = await rig.make({"hosted": HOSTED})
    entry, replies = await run_job(executor, plan_job("hosted", tools="not a list"))
    reply = replies[-1]
    assert (reply.kind, reply.meta.status) == ("error", 400)
    assert reply.data["error"]["code"] == "invalid_value"  # OpenAI's, not ours
    assert entry.outcome == reply.meta.outcome == "backend_rejected"  # the ledger's name
    assert "#0" not in reply.data["error"]["message"]
