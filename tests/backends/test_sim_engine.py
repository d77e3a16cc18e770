"""Batching, queueing and metrics: the engine alone, then through HTTP and /metrics."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import openai
import pytest

from backends.sim.engine import QueueFull, SimEngine
from backends.sim.tokens import count_tokens
from tests.backends.conftest import SMALL, RunningSim, StartSim, profile
from tests.support import value_when

MESSAGES = [{"role": "user", "content": "Count the tokens, please."}]


async def test_engine_is_fifo_and_survives_cancelled_waiters() -> None:
    engine = SimEngine(profile(max_num_seqs=1))
    order: list[int] = []
    gate = asyncio.Event()

    async def job(i: int) -> None:
        async with engine.slot(["t"] * 6, 4):  # 10 tokens: one block
            order.append(i)
            await gate.wait()

    tasks = [asyncio.create_task(job(i)) for i in range(4)]
    await asyncio.sleep(0)
    assert (engine.running, engine.waiting) == (1, 3)
    assert engine.kv_usage == 1 / engine.cache.num_blocks
    tasks[1].cancel()  # a waiter that leaves must not take a slot with it
    await asyncio.sleep(0)
    assert engine.waiting == 2
    gate.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert order == [0, 2, 3]
    assert (engine.running, engine.waiting, engine.kv_usage) == (0, 0, 0.0)


async def test_engine_queue_cap_and_slowdown() -> None:
    engine = SimEngine(profile(max_num_seqs=2, max_num_queued=1, load_slowdown=3.0))
    assert engine.itl_s() == pytest.approx(0.012)
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(engine.slot(["t"], 0))
        await stack.enter_async_context(engine.slot(["t"], 0))
        assert engine.slowdown() == pytest.approx(3.0)
        assert engine.ttft_s(1000) == pytest.approx((0.020 + 0.05) * 3.0)
        waiter = asyncio.create_task(stack.enter_async_context(engine.slot(["t"], 0)))
        await asyncio.sleep(0)
        with pytest.raises(QueueFull):
            engine.check_admission()
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter


async def _stream_all(client: openai.AsyncOpenAI) -> int:
    stream = await client.chat.completions.create(
        model=SMALL,
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    assert chunks[-1].usage is not None
    return chunks[-1].usage.completion_tokens


async def _until(sim: RunningSim, metric: str, value: float) -> None:
    await value_when(
        lambda: sim.metric(metric),
        lambda got: got == value,
        5.0,
        what=f"{metric} never reached {value}",
        every_s=0.01,
    )


async def test_batching_caps_running_and_queues_the_rest(start_sim: StartSim) -> None:
    # 20 tokens at 5 ms each: ~0.1 s per request, 2 at a time, 8 requests -> ~0.4 s.
    prof = profile(max_num_seqs=2, itl_s=0.005, min_output_tokens=20, max_output_tokens=20)
    sim = await start_sim(prof, time_scale=1.0)
    seen: list[tuple[float, float, float]] = []

    async def watch() -> None:
        while True:
            seen.append(
                (
                    await sim.metric("vllm:num_requests_running"),
                    await sim.metric("vllm:num_requests_waiting"),
                    await sim.metric("vllm:kv_cache_usage_perc"),
                )
            )
            await asyncio.sleep(0.01)

    watcher = asyncio.create_task(watch())
    try:
        async with sim.client() as client:
            tokens = await asyncio.gather(*(_stream_all(client) for _ in range(8)))
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    assert tokens == [20] * 8
    assert max(r for r, _, _ in seen) == 2
    assert max(w for _, w, _ in seen) > 0
    assert max(kv for _, _, kv in seen) > 0
    assert await sim.metric("vllm:num_requests_running") == 0
    assert await sim.metric("vllm:e2e_request_latency_seconds_count") == 8
    # ITL observed per token: 19 gaps per request
    assert await sim.metric("vllm:inter_token_latency_seconds_count") == 8 * 19
    assert await sim.metric("vllm:inter_token_latency_seconds_bucket", le="0.01") == 8 * 19


async def test_full_queue_is_refused_with_503(start_sim: StartSim) -> None:
    prof = profile(max_num_seqs=1, max_num_queued=0, itl_s=0.01, min_output_tokens=30)
    sim = await start_sim(prof, time_scale=1.0)
    async with sim.client() as client:
        first = asyncio.create_task(_stream_all(client))
        await _until(sim, "vllm:num_requests_running", 1)
        resp = await sim.post_chat({"messages": MESSAGES})
        assert resp.status == 503 and resp.headers["Retry-After"] == "1"
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model=SMALL, messages=MESSAGES, stream=True)
        assert await first >= 30


async def test_counters_reconcile_with_usage(start_sim: StartSim) -> None:
    sim = await start_sim()
    totals: dict[str, int] = {"prompt": 0, "completion": 0}
    async with sim.client() as client:
        for i in range(3):
            messages: Any = [{"role": "user", "content": f"Question number {i}?"}]
            answer = await client.chat.completions.create(
                model=SMALL, messages=messages, max_tokens=50 if i == 2 else None
            )
            assert answer.usage is not None
            totals["prompt"] += answer.usage.prompt_tokens
            totals["completion"] += answer.usage.completion_tokens
            assert count_tokens(answer.choices[0].message.content or "") == (
                answer.usage.completion_tokens
            )
    prompt_total = await sim.metric("vllm:prompt_tokens_total", model_name=SMALL, engine="0")
    assert prompt_total == totals["prompt"]
    assert await sim.metric("vllm:generation_tokens_total") == totals["completion"]
    stops = await sim.metric("vllm:request_success_total", finished_reason="stop")
    lengths = await sim.metric("vllm:request_success_total", finished_reason="length")
    assert stops + lengths == 3
    assert await sim.metric("vllm:time_to_first_token_seconds_count") == 3


async def test_client_leaving_mid_stream_counts_as_abort(start_sim: StartSim) -> None:
    sim = await start_sim(profile(itl_s=0.01, min_output_tokens=100), time_scale=1.0)
    async with sim.client() as client:
        stream = await client.chat.completions.create(model=SMALL, messages=MESSAGES, stream=True)
        async for _ in stream:
            break
        await stream.close()
    await _until(sim, "vllm:num_requests_running", 0)
    assert await sim.metric("vllm:request_success_total", finished_reason="abort") == 1
