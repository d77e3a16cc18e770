"""The simulator's embedding profile over HTTP: vectors, base64, limits, and no chat."""

from __future__ import annotations

import base64
import struct
from collections.abc import AsyncIterator

import httpx
import pytest
from aiohttp import web

from backends.sim import PROFILES, create_sim_app
from backends.sim.embeddings import embed_vector
from tests.support import free_port


@pytest.fixture
async def sim() -> AsyncIterator[str]:
    runner = web.AppRunner(create_sim_app(PROFILES["bge-m3"], time_scale=0))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_vectors_and_usage(sim: str) -> None:
    async with httpx.AsyncClient() as client:
        r = await client.post(f"{sim}/v1/embeddings", json={"input": ["a b", "c"]})
        b64 = await client.post(
            f"{sim}/v1/embeddings", json={"input": "a b", "encoding_format": "base64"}
        )
    assert r.status_code == 200
    body = r.json()
    assert body["usage"] == {"prompt_tokens": 3, "total_tokens": 3, "completion_tokens": 0}
    assert body["data"][0]["embedding"] == embed_vector(b"a b", 1024)
    packed = base64.b64decode(b64.json()["data"][0]["embedding"])
    unpacked = struct.unpack("<1024f", packed)
    assert max(abs(x - y) for x, y in zip(unpacked, embed_vector(b"a b", 1024), strict=True)) < 1e-6


async def test_refusals(sim: str) -> None:
    async with httpx.AsyncClient() as client:
        long = await client.post(f"{sim}/v1/embeddings", json={"input": "w " * 9000})
        chat = await client.post(
            f"{sim}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
        )
        dims = await client.post(f"{sim}/v1/embeddings", json={"input": "x", "dimensions": 4096})
    assert long.status_code == 400 and "maximum context length" in long.json()["error"]["message"]
    assert chat.status_code == 400
    assert dims.status_code == 400 and dims.json()["error"]["param"] == "dimensions"
