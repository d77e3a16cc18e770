"""Fault injection through /admin/faults, observed with the openai client and raw HTTP."""

from __future__ import annotations

import asyncio
import time

import openai
import pytest

from tests.backends.conftest import EXTERNAL, LARGE, SMALL, RunningSim, StartSim, profile

MESSAGES = [{"role": "user", "content": "Tell me about fallbacks."}]
BODY = {"model": SMALL, "messages": MESSAGES}


async def _ask(sim: RunningSim, **kw: object) -> str:
    async with sim.client() as client:
        answer = await client.chat.completions.create(
            model=sim.profile.name,
            messages=MESSAGES,
            **kw,
        )
    return answer.choices[0].message.content or ""


async def test_admin_endpoint_sets_shows_and_clears(start_sim: StartSim) -> None:
    sim = await start_sim()
    url = f"{sim.base_url}/admin/faults"
    async with sim.http.get(url) as resp:
        assert await resp.json() == {}
    await sim.set_faults(error_status=500, error_rate=0.5)
    async with sim.http.get(url) as resp:
        assert await resp.json() == {"error_status": 500, "error_rate": 0.5}
    await sim.set_faults(rate_limit=True)  # a POST replaces the whole set
    async with sim.http.get(url) as resp:
        assert await resp.json() == {"rate_limit": True}
    await sim.clear_faults()
    async with sim.http.get(url) as resp:
        assert await resp.json() == {}
    for bad in ({"explode": True}, {"error_rate": 2}, {"hang": "yes"}, [1]):
        async with sim.http.post(url, json=bad) as resp:
            assert resp.status == 400, bad
            assert "message" in (await resp.json())["error"]


async def test_error_status_for_all_or_some_requests(start_sim: StartSim) -> None:
    sim = await start_sim()
    await sim.set_faults(error_status=500)
    with pytest.raises(openai.InternalServerError) as exc:
        await _ask(sim)
    assert exc.value.status_code == 500
    assert exc.value.body == {
        "message": "Simulated error 500 (fault injection).",
        "type": "InternalServerError",
        "param": None,
        "code": 500,
    }

    await sim.set_faults(error_status=502, error_rate=0.5)
    statuses = [(await sim.post_chat(BODY)).status for _ in range(40)]
    assert set(statuses) == {200, 502}
    assert 8 <= statuses.count(502) <= 32


@pytest.mark.parametrize(
    ("fault", "status", "error"),
    [
        ({"rate_limit": True, "retry_after": 2}, 429, openai.RateLimitError),
        ({"overloaded": True, "retry_after": 1}, 503, openai.InternalServerError),
    ],
)
async def test_rate_limit_and_overload_carry_retry_after(
    start_sim: StartSim, fault: dict[str, object], status: int, error: type[Exception]
) -> None:
    sim = await start_sim()
    await sim.set_faults(**fault)
    resp = await sim.post_chat(BODY)
    assert resp.status == status
    assert resp.headers["Retry-After"] == str(fault["retry_after"])
    assert (await resp.json())["error"]["code"] == status
    with pytest.raises(error):
        await _ask(sim)


async def test_openai_flavour_rate_limit_body(start_sim: StartSim) -> None:
    sim = await start_sim(profile(EXTERNAL))
    await sim.set_faults(rate_limit=True, retry_after=3)
    resp = await sim.post_chat({"model": EXTERNAL, "messages": MESSAGES})
    assert resp.status == 429 and resp.headers["Retry-After"] == "3"
    error = (await resp.json())["error"]
    assert (error["type"], error["code"]) == ("requests", "rate_limit_exceeded")


async def test_hang_holds_requests_until_cleared(start_sim: StartSim) -> None:
    sim = await start_sim()
    await sim.set_faults(hang=True)
    pending = asyncio.create_task(_ask(sim))
    done, _ = await asyncio.wait({pending}, timeout=0.3)
    assert not done
    async with sim.http.get(f"{sim.base_url}/health") as resp:
        assert resp.status == 200  # only the chat API hangs
    await sim.clear_faults()
    assert await asyncio.wait_for(pending, timeout=5)


async def test_hung_requests_are_dropped_at_shutdown(start_sim: StartSim) -> None:
    sim = await start_sim()
    await sim.set_faults(hang=True)
    pending = asyncio.create_task(_ask(sim))
    await asyncio.sleep(0.1)
    await sim.app.shutdown()  # what the runner does first on cleanup
    with pytest.raises(openai.APIConnectionError):
        await asyncio.wait_for(pending, timeout=5)


async def test_slow_first_token(start_sim: StartSim) -> None:
    sim = await start_sim()  # time_scale 0: the fault delay is the only wait
    await sim.set_faults(slow_first_token_ms=300)
    async with sim.client() as client:
        started = time.perf_counter()
        stream = await client.chat.completions.create(model=SMALL, messages=MESSAGES, stream=True)
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - started
                break
        await stream.close()
    assert 0.3 <= first < 5.0
    started = time.perf_counter()
    await _ask(sim)
    assert time.perf_counter() - started >= 0.3
    assert await sim.metric("vllm:time_to_first_token_seconds_sum") >= 0.6


async def test_cut_stream_drops_after_n_tokens(start_sim: StartSim) -> None:
    sim = await start_sim()
    await sim.set_faults(cut_after_tokens=10)
    contents: list[str] = []
    reasons: list[str | None] = []
    async with sim.client() as client:
        stream = await client.chat.completions.create(model=SMALL, messages=MESSAGES, stream=True)
        with pytest.raises(openai.APIConnectionError):
            async for chunk in stream:
                contents.extend(c.delta.content for c in chunk.choices if c.delta.content)
                reasons.extend(c.finish_reason for c in chunk.choices)
    assert len(contents) == 10
    assert set(reasons) == {None}
    assert await sim.metric("vllm:request_success_total", finished_reason="abort") == 1


async def test_cut_non_stream_drops_mid_body(start_sim: StartSim) -> None:
    sim = await start_sim()
    await sim.set_faults(cut_after_tokens=3)
    with pytest.raises(openai.APIConnectionError):
        await _ask(sim)
    await sim.set_faults(cut_after_tokens=10_000)  # longer than any answer: no cut
    assert await _ask(sim)


async def test_unhealthy(start_sim: StartSim) -> None:
    sim = await start_sim()
    await sim.set_faults(unhealthy=True)
    async with sim.http.get(f"{sim.base_url}/health") as resp:
        assert resp.status == 503
    assert await _ask(sim)  # the API itself still answers
    await sim.clear_faults()
    async with sim.http.get(f"{sim.base_url}/health") as resp:
        assert resp.status == 200


async def test_a_cut_stream_is_completed_by_continuation_on_another_tier(
    start_sim: StartSim,
) -> None:
    small, large = await start_sim(), await start_sim(profile(LARGE))
    await small.set_faults(cut_after_tokens=7)
    received: list[str] = []
    async with small.client() as client:
        stream = await client.chat.completions.create(model=SMALL, messages=MESSAGES, stream=True)
        with pytest.raises(openai.APIConnectionError):
            async for chunk in stream:
                received.extend(c.delta.content for c in chunk.choices if c.delta.content)
    await small.clear_faults()
    prefix = "".join(received)
    async with large.client() as client:
        rest = await client.chat.completions.create(
            model=LARGE,
            messages=[*MESSAGES, {"role": "assistant", "content": prefix}],
            extra_body={"continue_final_message": True, "add_generation_prompt": False},
        )
    assert prefix + (rest.choices[0].message.content or "") == await _ask(small)
