"""The usage log: one JSON line per chat request, errors included."""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai
import orjson
import pytest

from tests.backends.conftest import SMALL, StartSim

MESSAGES = [
    {"role": "user", "content": "Log this, please: one line per request, with its outcome."}
]  # 22 prompt tokens: one full block, cached by the first request for the next ones


async def test_one_line_per_request_with_its_outcome(start_sim: StartSim, tmp_path: Path) -> None:
    log = tmp_path / "logs" / "usage.jsonl"
    sim = await start_sim(usage_log=log)
    async with sim.client() as client:
        answer = await client.chat.completions.create(
            model=SMALL,
            messages=MESSAGES,
            extra_headers={"x-request-id": "req-json"},
        )
        stream = await client.chat.completions.create(
            model=SMALL,
            messages=MESSAGES,
            stream=True,
            max_tokens=4,
            extra_headers={"x-request-id": "req-stream"},
        )
        async for _ in stream:
            pass
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="nope", messages=MESSAGES)
        await sim.set_faults(cut_after_tokens=2)
        stream = await client.chat.completions.create(
            model=SMALL,
            messages=MESSAGES,
            stream=True,
            extra_headers={"x-request-id": "req-cut"},
        )
        with pytest.raises(openai.APIConnectionError):
            async for _ in stream:
                pass
    assert answer.usage is not None

    lines = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    assert len(lines) == 4
    assert all(isinstance(line.pop("ts"), float) for line in lines)
    generated_id = lines[2].pop("request_id")
    assert generated_id.startswith("sim-")
    assert lines == [
        {
            "request_id": "req-json",
            "model": SMALL,
            "stream": False,
            "status": 200,
            "prompt_tokens": answer.usage.prompt_tokens,
            "completion_tokens": answer.usage.completion_tokens,
            "cached_tokens": 0,
            "finish_reason": "stop",
            "fault": None,
        },
        {
            "request_id": "req-stream",
            "model": SMALL,
            "stream": True,
            "status": 200,
            "prompt_tokens": answer.usage.prompt_tokens,
            "completion_tokens": 4,
            "cached_tokens": 16,
            "finish_reason": "length",
            "fault": None,
        },
        {
            "model": SMALL,
            "stream": False,
            "status": 404,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "cached_tokens": 0,
            "finish_reason": None,
            "fault": None,
        },
        {
            "request_id": "req-cut",
            "model": SMALL,
            "stream": True,
            "status": 200,
            "prompt_tokens": answer.usage.prompt_tokens,
            "completion_tokens": 2,
            "cached_tokens": 16,
            "finish_reason": "abort",
            "fault": "cut_after_tokens",
        },
    ]


async def test_fault_errors_are_logged(start_sim: StartSim, tmp_path: Path) -> None:
    log = tmp_path / "usage.jsonl"
    sim = await start_sim(usage_log=log)
    await sim.set_faults(rate_limit=True)
    resp = await sim.post_chat({"messages": MESSAGES, "stream": True}, **{"x-request-id": "r1"})
    assert resp.status == 429
    (line,) = [orjson.loads(raw) for raw in log.read_bytes().splitlines()]
    assert (line["request_id"], line["status"], line["stream"], line["fault"]) == (
        "r1",
        429,
        True,
        "rate_limit",
    )


async def test_a_malformed_answer_is_logged_as_cut(start_sim: StartSim, tmp_path: Path) -> None:
    """A non-streamed answer cut to a body that is not JSON was logged as complete (``stop``,
    no fault) though no client could read it: reconciling a gateway's rows against the log
    counted each such call as served twice (the chaos bench's ``double_run``)."""
    log = tmp_path / "usage.jsonl"
    sim = await start_sim(usage_log=log)
    await sim.set_faults(malformed_after_tokens=5)
    resp = await sim.post_chat({"messages": MESSAGES}, **{"x-request-id": "r-bad"})
    assert resp.status == 200
    (line,) = [orjson.loads(raw) for raw in log.read_bytes().splitlines()]
    assert (line["finish_reason"], line["fault"]) == ("abort", "malformed_after_tokens")


async def test_a_non_streamed_answer_whose_client_left_is_aborted(
    start_sim: StartSim, tmp_path: Path
) -> None:
    """vLLM aborts a non-streamed request whose client disconnects; the simulator logged it
    as served in full, so a worker killed mid-call looked like a backend that served twice."""
    log = tmp_path / "usage.jsonl"
    sim = await start_sim(usage_log=log)
    await sim.set_faults(slow_first_token_ms=1500)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(
            sim.post_chat({"messages": MESSAGES}, **{"x-request-id": "r-gone"}), 0.3
        )
    for _ in range(50):
        if log.exists() and log.read_bytes():
            break
        await asyncio.sleep(0.1)
    (line,) = [orjson.loads(raw) for raw in log.read_bytes().splitlines()]
    assert (line["request_id"], line["finish_reason"]) == ("r-gone", "abort")
