"""The simulator's fault modes for the fallback work, as the VLLMBackend sees them: each one
must become the right BackendError (or a complete answer), never garbage passed on."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from backends.errors import (
    BackendConnectError,
    BackendError,
    BackendProtocolError,
    BackendRejected,
    BackendStreamCut,
    BackendTimeout,
    BackendUnavailable,
)
from backends.openai_http import VLLMBackend
from backends.types import ChatChunk, ChatRequest
from tests.backends.conftest import EXTERNAL, SMALL, RunningSim, StartSim, profile

MESSAGES = [{"role": "user", "content": "Tell me about fallbacks in some detail."}]


def request(model: str = SMALL) -> ChatRequest:
    return ChatRequest(model=model, body={"messages": MESSAGES, "max_tokens": 200}, request_id="r1")


@contextlib.asynccontextmanager
async def backend(sim: RunningSim, **kw: float) -> AsyncIterator[VLLMBackend]:
    b = VLLMBackend.create("sim", sim.base_url, **kw)
    try:
        yield b
    finally:
        await b.aclose()


async def drain(b: VLLMBackend, model: str = SMALL) -> list[ChatChunk]:
    chunks: list[ChatChunk] = []
    async with contextlib.aclosing(b.stream(request(model))) as stream:
        async for chunk in stream:
            chunks.append(chunk)
    return chunks


async def test_new_fault_keys_validate(start_sim: StartSim) -> None:
    sim = await start_sim()
    url = f"{sim.base_url}/admin/faults"
    for bad in ({"flap": 1}, {"end_after_tokens": -1}, {"stall_ms": "x"}, {"reset": "yes"}):
        async with sim.http.post(url, json=bad) as resp:
            assert resp.status == 400, bad
    await sim.set_faults(stall_after_tokens=3, stall_ms=10)
    async with sim.http.get(url) as resp:
        assert await resp.json() == {"stall_after_tokens": 3, "stall_ms": 10.0}


async def test_flap_fails_every_other_call(start_sim: StartSim) -> None:
    sim = await start_sim()
    await sim.set_faults(flap=True, error_status=503)
    outcomes = []
    async with backend(sim) as b:
        for _ in range(4):
            try:
                await b.chat(request())
                outcomes.append("ok")
            except BackendUnavailable:
                outcomes.append("503")
    assert outcomes == ["503", "ok", "503", "ok"]


async def test_reset_is_a_connect_error(start_sim: StartSim) -> None:
    sim = await start_sim()
    await sim.set_faults(reset=True)
    async with backend(sim) as b:
        with pytest.raises(BackendConnectError):
            await b.chat(request())
        with pytest.raises(BackendConnectError):
            await drain(b)


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ({"malformed_after_tokens": 5}, BackendProtocolError),
        ({"end_after_tokens": 5}, BackendStreamCut),
        ({"cut_after_tokens": 5}, BackendStreamCut),
    ],
)
async def test_broken_streams_raise_after_the_good_chunks(
    start_sim: StartSim, fault: dict[str, int], error: type[BackendError]
) -> None:
    sim = await start_sim()
    await sim.set_faults(**fault)
    received: list[str] = []
    async with backend(sim) as b:
        with pytest.raises(error):
            async with contextlib.aclosing(b.stream(request())) as stream:
                async for chunk in stream:
                    for choice in chunk.data["choices"]:
                        received.append(choice["delta"].get("content") or "")
    assert len([piece for piece in received if piece]) == 5


async def test_malformed_non_stream_body_is_a_protocol_error(start_sim: StartSim) -> None:
    sim = await start_sim()
    await sim.set_faults(malformed_after_tokens=0)
    async with backend(sim) as b:
        with pytest.raises(BackendProtocolError):
            await b.chat(request())


async def test_a_finished_stream_without_done_is_complete(start_sim: StartSim) -> None:
    sim = await start_sim()
    await sim.set_faults(omit_done=True)
    async with backend(sim) as b:
        chunks = await drain(b)
    reasons = [c["finish_reason"] for ch in chunks for c in ch.data.get("choices", [])]
    assert reasons[-1] == "stop"
    assert chunks[-1].usage is not None


async def test_stall_mid_stream_trips_the_stall_timeout(start_sim: StartSim) -> None:
    sim = await start_sim()
    await sim.set_faults(stall_after_tokens=5, stall_ms=5000)
    async with backend(sim, stall_s=0.3) as b:
        with pytest.raises(BackendTimeout, match="stall"):
            await drain(b)


async def test_stall_in_a_non_streamed_answer_trips_the_total_timeout(
    start_sim: StartSim, tmp_path: Path
) -> None:
    """Non-streamed, the stall holds the body after the status and headers went out; the
    client that gives up aborts the request, logged at the tokens generated before the stall."""
    log = tmp_path / "usage.jsonl"
    sim = await start_sim(usage_log=log)
    await sim.set_faults(stall_after_tokens=5, stall_ms=5000)
    started = time.monotonic()
    async with backend(sim, total_s=0.5) as b:
        with pytest.raises(BackendTimeout):
            await b.chat(request())
    for _ in range(40):  # the simulator notices the closed connection within 50 ms
        if log.exists() and log.read_bytes():
            break
        await asyncio.sleep(0.05)
    (line,) = [orjson.loads(raw) for raw in log.read_bytes().splitlines()]
    assert (line["fault"], line["finish_reason"], line["completion_tokens"]) == (
        "stall_after_tokens",
        "abort",
        5,
    )
    assert time.monotonic() - started < 3  # not the 5 s stall
    await sim.set_faults(stall_after_tokens=5, stall_ms=50)
    async with backend(sim, total_s=5) as b:
        answer = await b.chat(request())  # a short stall: the whole answer, late
    assert answer.body["choices"][0]["finish_reason"] in {"stop", "length"}


async def test_content_filter_refusal_in_the_openai_flavour(start_sim: StartSim) -> None:
    sim = await start_sim(profile(EXTERNAL))
    await sim.set_faults(content_filter=True)
    async with sim.client() as client:
        answer = await client.chat.completions.create(model=EXTERNAL, messages=MESSAGES)
        assert answer.choices[0].finish_reason == "content_filter"
        assert not answer.choices[0].message.content
        stream = await client.chat.completions.create(
            model=EXTERNAL, messages=MESSAGES, stream=True
        )
        reasons = [c.finish_reason async for chunk in stream for c in chunk.choices]
    assert reasons[-1] == "content_filter"


async def test_refuses_prefill_rejects_only_a_continued_assistant_message(
    start_sim: StartSim,
) -> None:
    sim = await start_sim()
    await sim.set_faults(refuses_prefill=True)
    continued = ChatRequest(
        model=SMALL,
        body={
            "messages": [*MESSAGES, {"role": "assistant", "content": "Fallbacks are"}],
            "continue_final_message": True,
            "add_generation_prompt": False,
            "max_tokens": 20,
        },
        request_id="r2",
    )
    async with backend(sim) as b:
        with pytest.raises(BackendRejected) as info:
            await b.chat(continued)
        assert "prefill" in info.value.message and info.value.status == 400
        assert (await b.chat(request())).usage is not None  # a fresh request is answered
