"""The coalescer: commands queued in one turn of the loop share one pipeline (real Redis)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from gateway.coalescer import Coalescer


class CountingRedis:
    """The real client, counting the pipelines it opens."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self.pipelines = 0

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        self.pipelines += 1
        return self.client.pipeline(*args, **kwargs)


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    c = aioredis.Redis.from_url(redis_url)
    yield c
    await c.aclose()


async def test_one_turns_commands_share_a_pipeline_and_get_their_own_replies(
    client: aioredis.Redis, key_prefix: str
) -> None:
    counting = CountingRedis(client)
    coalescer = Coalescer(counting)  # type: ignore[arg-type]
    key = f"{key_prefix}:n"
    text = f"{key_prefix}:s"
    await client.set(text, "x")
    futures = [coalescer.send(lambda p: p.incr(key)) for _ in range(20)]
    wrong = coalescer.send(lambda p: p.incr(text))  # an error reply fails its own future only
    assert await asyncio.gather(*futures) == list(range(1, 21))
    with pytest.raises(ResponseError):
        await wrong
    assert counting.pipelines == 1
    await coalescer.aclose()


async def test_commands_queued_while_a_pipeline_is_out_go_in_the_next_and_in_order(
    client: aioredis.Redis, key_prefix: str
) -> None:
    counting = CountingRedis(client)
    coalescer = Coalescer(counting)  # type: ignore[arg-type]
    key = f"{key_prefix}:list"
    first = coalescer.send(lambda p: p.rpush(key, "a"))
    await asyncio.sleep(0)  # the first pipeline is on its way
    later = [coalescer.send(lambda p, v=v: p.rpush(key, v)) for v in "bcd"]
    await asyncio.gather(first, *later)
    assert await client.lrange(key, 0, -1) == [b"a", b"b", b"c", b"d"]
    assert counting.pipelines == 2
    await coalescer.aclose()


async def test_fire_and_forget_failures_are_logged_and_close_sends_what_is_queued(
    client: aioredis.Redis, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    coalescer = Coalescer(client)
    key = f"{key_prefix}:k"
    coalescer.send_nowait(lambda p: p.set(key, "done"), "test set")
    coalescer.send_nowait(lambda p: p.lpush(key, "x"), "wrong type")  # WRONGTYPE
    with caplog.at_level(logging.WARNING, logger="gateway.coalescer"):
        await coalescer.aclose()
    assert await client.get(key) == b"done"
    assert "wrong type" in caplog.text
    with pytest.raises(RuntimeError):
        coalescer.send_nowait(lambda p: p.get(key), "after close")


async def test_a_dead_redis_fails_every_future_of_the_batch() -> None:
    dead = aioredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    coalescer = Coalescer(dead)
    futures = [coalescer.send(lambda p: p.get("k")) for _ in range(3)]
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert all(isinstance(r, Exception) for r in results)
    await coalescer.aclose()
    await dead.aclose()
