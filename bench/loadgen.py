"""The overhead bench's load generator: asyncio + aiohttp, keep-alive connections, one target at a
time. A *target* is an OpenAI-compatible chat endpoint (the simulator directly, or a gateway in
front of it). A *block* is a short burst of load against one target; ``bench.points`` runs
blocks alternately against the direct target and the gateways (``bench.overhead``: tiergate;
``bench.compare``: tiergate and LiteLLM's proxy).

- ``closed_block``: ``concurrency`` workers, each sending its next request when the last one
  is answered (at most ``concurrency`` keep-alive connections);
- ``open_block``: requests started at a fixed rate whatever the answers do; latency counts from
  the scheduled start (no coordinated omission), so a lagging client or server shows;
- ``stream_block``: ``concurrency`` workers, each reading SSE streams back to back, timing the
  first content chunk and every gap between content chunks.

Anything but a 200 with the expected answer is an error, counted by kind, never dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

__all__ = [
    "Block",
    "StreamBlock",
    "Target",
    "closed_block",
    "new_session",
    "open_block",
    "pct",
    "server_timing",
    "stream_block",
]

TIMEOUT = aiohttp.ClientTimeout(total=60, sock_connect=5)


@dataclass(frozen=True)
class Target:
    name: str
    """``direct``, or the gateway's name (``through`` in the overhead bench)."""
    url: str
    """The chat-completions URL."""
    headers: Mapping[str, str]
    model: str
    completion_tokens: int
    """How many tokens every answer must have (``max_tokens``; the prompts are chosen so)."""


@dataclass
class _Timed:
    target: str
    started: float = 0.0
    wall_s: float = 0.0
    sent: int = 0
    errors: Counter[str] = field(default_factory=Counter)


@dataclass
class Block(_Timed):
    """One block of non-streamed requests against one target."""

    latencies_s: list[float] = field(default_factory=list)
    stages_ms: dict[str, list[float]] = field(default_factory=dict)
    """``Server-Timing`` entries, by name (empty when the target sends none)."""
    overhead_header_ms: list[float] = field(default_factory=list)
    """tiergate's own ``x-tiergate-overhead-ms`` (empty for other targets)."""
    last_done: float = 0.0

    @property
    def ok(self) -> int:
        return len(self.latencies_s)


@dataclass
class StreamBlock(_Timed):
    """One block of streamed requests against one target."""

    ttft_s: list[float] = field(default_factory=list)
    gaps_s: list[float] = field(default_factory=list)
    """Every gap between two consecutive content chunks, over all streams."""
    max_gap_per_stream_s: list[float] = field(default_factory=list)
    stages_ms: dict[str, list[float]] = field(default_factory=dict)
    """``Server-Timing`` entries of the answered streams (the gateway's time to the first
    chunk), by name (empty when the target sends none)."""

    @property
    def ok(self) -> int:
        return len(self.ttft_s)


def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..1) of ``values``; ``None`` when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def server_timing(header: str) -> dict[str, float]:
    """``parse;dur=0.05, auth;dur=0.02`` -> ``{"parse": 0.05, "auth": 0.02}`` (ms); entries
    without a numeric ``dur`` are skipped."""
    out: dict[str, float] = {}
    for entry in header.split(","):
        name, *params = (part.strip() for part in entry.split(";"))
        for param in params:
            key, _, value = param.partition("=")
            if name and key.strip().lower() == "dur":
                with contextlib.suppress(ValueError):
                    out[name] = float(value.strip().strip('"'))
    return out


def new_session(connections: int) -> aiohttp.ClientSession:
    """A client with at most ``connections`` keep-alive connections (0: no limit)."""
    connector = aiohttp.TCPConnector(limit=connections, force_close=False, ttl_dns_cache=None)
    return aiohttp.ClientSession(connector=connector, timeout=TIMEOUT)


def _payload(target: Target, messages: list[dict[str, str]], stream: bool) -> bytes:
    body: dict[str, Any] = {
        "model": target.model,
        "messages": messages,
        "max_tokens": target.completion_tokens,
        "temperature": 0,
    }
    if stream:
        body["stream"] = True
    return orjson.dumps(body)


def _record_headers(block: Block, headers: Mapping[str, str]) -> None:
    timing = headers.get("server-timing")
    if timing:
        for name, dur in server_timing(timing).items():
            block.stages_ms.setdefault(name, []).append(dur)
    overhead = headers.get("x-tiergate-overhead-ms")
    if overhead:
        block.overhead_header_ms.append(float(overhead))


async def _one(
    session: aiohttp.ClientSession, target: Target, body: bytes, block: Block, start: float
) -> None:
    """One request; its latency counts from ``start`` (perf_counter)."""
    try:
        async with session.post(target.url, data=body, headers=target.headers) as resp:
            data = await resp.read()
            if resp.status != 200:
                block.errors[f"http_{resp.status}"] += 1
                return
            done = time.perf_counter()
            usage = orjson.loads(data).get("usage") or {}
            if usage.get("completion_tokens") != target.completion_tokens:
                block.errors["wrong_completion_tokens"] += 1
                return
            _record_headers(block, resp.headers)
    except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
        block.errors[type(exc).__name__] += 1
        return
    block.latencies_s.append(done - start)
    block.last_done = max(block.last_done, done)


async def _closed_loop(
    block: _Timed,
    bodies: list[bytes],
    one: Callable[[bytes], Awaitable[None]],
    *,
    concurrency: int,
    duration_s: float,
    stagger_s: float = 0.0,
) -> None:
    """``concurrency`` workers each send ``one`` request after another (the bodies in turn)
    until ``duration_s`` has passed, then finish the one they are in."""
    block.started = time.perf_counter()
    end = block.started + duration_s

    async def worker(w: int) -> None:
        if stagger_s:
            await asyncio.sleep(w / concurrency * stagger_s)
        i = w
        while time.perf_counter() < end:
            block.sent += 1
            await one(bodies[i % len(bodies)])
            i += concurrency

    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    block.wall_s = time.perf_counter() - block.started


async def closed_block(
    session: aiohttp.ClientSession,
    target: Target,
    prompts: list[list[dict[str, str]]],
    *,
    concurrency: int,
    duration_s: float,
) -> Block:
    block = Block(target.name)

    async def one(body: bytes) -> None:
        await _one(session, target, body, block, time.perf_counter())

    bodies = [_payload(target, m, stream=False) for m in prompts]
    await _closed_loop(block, bodies, one, concurrency=concurrency, duration_s=duration_s)
    return block


async def open_block(
    session: aiohttp.ClientSession,
    target: Target,
    prompts: list[list[dict[str, str]]],
    *,
    rate: float,
    duration_s: float,
    max_in_flight: int = 2000,
) -> Block:
    """``rate`` requests/s for ``duration_s``, then wait for the stragglers. ``wall_s`` runs
    from the first scheduled start to the last answer (the achieved rate is ``ok / wall_s``)."""
    block = Block(target.name)
    bodies = [_payload(target, m, stream=False) for m in prompts]
    tasks: set[asyncio.Task[None]] = set()
    total = int(rate * duration_s)
    block.started = time.perf_counter()
    for i in range(total):
        due = block.started + i / rate
        wait = due - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        block.sent += 1
        if len(tasks) >= max_in_flight:
            block.errors["client_in_flight_cap"] += 1
            continue
        task = asyncio.create_task(_one(session, target, bodies[i % len(bodies)], block, due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
    block.wall_s = (block.last_done or time.perf_counter()) - block.started
    return block


def _content(line: bytes) -> bool | None:
    """Whether an SSE line is a chunk with content (``None``: the line is ``[DONE]``)."""
    payload = line[5:].strip()
    if payload == b"[DONE]":
        return None
    chunk = orjson.loads(payload)
    if "error" in chunk:
        raise _StreamError("error_event")
    for choice in chunk.get("choices") or ():
        if choice.get("finish_reason") == "error":
            raise _StreamError("stream_error")
        if (choice.get("delta") or {}).get("content"):
            return True
    return False


class _StreamError(Exception):
    pass


async def _one_stream(
    session: aiohttp.ClientSession, target: Target, body: bytes, block: StreamBlock
) -> None:
    arrivals: list[float] = []
    timing: dict[str, float] = {}
    done = False
    start = time.perf_counter()
    try:
        async with session.post(target.url, data=body, headers=target.headers) as resp:
            if resp.status != 200:
                await resp.read()
                block.errors[f"http_{resp.status}"] += 1
                return
            timing = server_timing(resp.headers.get("server-timing", ""))
            async for line in resp.content:
                if not line.startswith(b"data:"):
                    continue
                now = time.perf_counter()
                has_content = _content(line)
                if has_content is None:
                    done = True
                elif has_content:
                    arrivals.append(now)
    except _StreamError as exc:
        block.errors[str(exc)] += 1
        return
    except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
        block.errors[type(exc).__name__] += 1
        return
    if not done:
        block.errors["no_done"] += 1
    elif len(arrivals) != target.completion_tokens:
        block.errors[f"wrong_chunk_count_{len(arrivals)}"] += 1
    else:
        block.ttft_s.append(arrivals[0] - start)
        for name, dur in timing.items():
            block.stages_ms.setdefault(name, []).append(dur)
        gaps = [b - a for a, b in itertools.pairwise(arrivals)]
        block.gaps_s.extend(gaps)
        block.max_gap_per_stream_s.append(max(gaps, default=0.0))


async def stream_block(
    session: aiohttp.ClientSession,
    target: Target,
    prompts: list[list[dict[str, str]]],
    *,
    concurrency: int,
    duration_s: float,
    spread_s: float = 0.05,
) -> StreamBlock:
    """Workers read streams back to back; their first starts are spread over ``spread_s`` (one
    stream's length: the steady state of ``concurrency`` open streams, not that many arriving
    in the same instant, which would measure a burst's queue instead)."""
    block = StreamBlock(target.name)

    async def one(body: bytes) -> None:
        await _one_stream(session, target, body, block)

    bodies = [_payload(target, m, stream=True) for m in prompts]
    await _closed_loop(
        block, bodies, one, concurrency=concurrency, duration_s=duration_s, stagger_s=spread_s
    )
    return block
