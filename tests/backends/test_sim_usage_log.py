"""The usage log: one JSON line per chat request, errors included."""

from __future__ import annotations

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
