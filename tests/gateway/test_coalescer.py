"""The coalescer: commands queued in one turn of the loop share one pipeline (real Redis)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from gateway.coalescer import Coalescer


class CountingRedis:
    """The real client, counting the pipelines it opens."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self.pipelines = 0

    def pipeline(self, transaction: bool = True) -> Pipeline:
        self.pipelines += 1
        return self.client.pipeline(transaction=transaction)


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    c = aioredis.Redis.from_url(redis_url)
    yield c
    await c.aclose()


async def test_one_turns_commands_share_a_pipeline_and_get_their_own_replies(
    client: aioredis.Redis, key_prefix: str
) -> None:
    counting = CountingRedis(client)
    coalescer = Coalescer(counting)
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
    coalescer = Coalescer(counting)
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


async def test_a_batch_that_fails_otherwise_than_redis_settles_every_future(
    client: aioredis.Redis,
) -> None:
    """A pipeline that raises something else than ``RedisError``/``OSError`` (uvloop raises
    ``RuntimeError`` writing to a transport closed under a killed cluster node; here an entry
    that raises) fails every future of its batch as a lost connection: none waits forever, and
    the next batch goes out."""

    def broken(_pipe: Pipeline) -> object:
        raise RuntimeError("unable to perform operation on <TCPTransport closed=True>")

    coalescer = Coalescer(client)
    futures = [
        coalescer.send(lambda p: p.set("tgco:broken:a", "1")),
        coalescer.send(broken),
        coalescer.send(lambda p: p.get("tgco:broken:a")),
    ]
    results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 5)
    assert all(isinstance(r, RedisConnectionError) for r in results), results
    assert await asyncio.wait_for(coalescer.send(lambda p: p.ping()), 5) is True
    await coalescer.aclose()
    await client.delete("tgco:broken:a")


# One entry, one reply: an entry may add several commands (a fire-and-forget one, e.g. a stream's
# mark with the run's note), and every other entry in the pipeline still gets its own reply.
# Each row: the commands of one fire-and-forget entry, as (name, args) on a key of the row's own.
ENTRY_SHAPES: list[tuple[str, list[tuple[str, tuple[Any, ...]]]]] = [
    ("one command", [("set", ("v",))]),
    ("two commands", [("set", ("v",)), ("expire", (60,))]),
    ("three commands", [("set", ("v",)), ("append", ("w",)), ("expire", (60,))]),
    ("no command", []),
    ("a failing command among two", [("set", ("v",)), ("lpush", ("x",))]),
]


@pytest.mark.parametrize(("shape", "commands"), ENTRY_SHAPES, ids=[s for s, _ in ENTRY_SHAPES])
async def test_every_caller_gets_its_own_reply_beside_multi_command_entries(
    client: aioredis.Redis,
    key_prefix: str,
    shape: str,
    commands: list[tuple[str, tuple[Any, ...]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    coalescer = Coalescer(client, max_batch=7)  # batches cut through the interleaved entries
    callers = 200

    def multi(key: str) -> Callable[[Pipeline], None]:
        def add(pipe: Pipeline) -> None:
            for name, args in commands:
                getattr(pipe, name)(key, *args)

        return add

    async def caller(i: int) -> Any:
        await asyncio.sleep(0.001 * (i % 5))  # callers queue in different turns of the loop
        coalescer.send_nowait(multi(f"{key_prefix}:m{i}"), f"entry {i}")
        # each caller's own reply: the value written for it, read back by one command
        return await coalescer.send(lambda p: p.get(f"{key_prefix}:c{i}"))

    await client.mset({f"{key_prefix}:c{i}": f"value-{i}" for i in range(callers)})
    with caplog.at_level(logging.WARNING):
        gathered = asyncio.gather(*(caller(i) for i in range(callers)))
        replies = await asyncio.wait_for(gathered, 10)
        await coalescer.aclose()
    assert replies == [f"value-{i}".encode() for i in range(callers)], shape
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    failing = sum(1 for name, _ in commands if name == "lpush")
    assert caplog.text.count("failed: ResponseError") == callers * failing


async def test_a_send_entry_with_other_than_one_command_fails_its_own_future_only(
    client: aioredis.Redis, key_prefix: str
) -> None:
    coalescer = Coalescer(client)
    key = f"{key_prefix}:n"

    def two(pipe: Pipeline) -> None:
        pipe.incr(key)
        pipe.incr(key)

    before = coalescer.send(lambda p: p.incr(key))
    double = coalescer.send(two)
    after = coalescer.send(lambda p: p.incr(key))
    assert await before == 1
    with pytest.raises(ValueError, match="one command"):
        await double
    assert await after == 4  # the two-command entry ran, its replies went to nobody else
    await coalescer.aclose()
