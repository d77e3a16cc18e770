"""Every Redis step tiergate takes stays in one Cluster slot: each multi-key command, each script
(the keys it declares and every key the commands it runs touch, declared or not), each
``MULTI``/``EXEC``. A Redis Cluster refuses anything else (``CROSSSLOT``; a script touching
a key of another slot), so a key without the right hash tag shows up here first.

A redis-server of the test's own is watched with ``MONITOR`` (which also shows the commands
scripts run) while a gateway in process serves streamed and plain requests, idempotency keys,
budgets, rate limits, queued and direct starts; each command's keys are those the server
names (``COMMAND GETKEYS``) and their slots are computed with redis-py's ``key_slot``.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import key_slot

from tests.inprocess import SMALL, inprocess_gateway
from tests.support import RedisServer

ACME = {"authorization": "Bearer dev-acme"}
_QUOTED = re.compile(rb'"((?:\\.|[^"\\])*)"')
_ESCAPES = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"a": b"\a", b"b": b"\b"}


@dataclass(frozen=True)
class Seen:
    """One command as ``MONITOR`` showed it: who sent it (``lua`` for a script's own)."""

    source: str
    args: tuple[bytes, ...]

    @property
    def name(self) -> str:
        return self.args[0].decode().upper()


def _unescape(raw: bytes) -> bytes:
    out, i = bytearray(), 0
    while i < len(raw):
        c = raw[i : i + 1]
        if c == b"\\" and i + 1 < len(raw):
            nxt = raw[i + 1 : i + 2]
            if nxt == b"x":
                out += bytes([int(raw[i + 2 : i + 4], 16)])
                i += 4
                continue
            out += _ESCAPES.get(nxt, nxt)
            i += 2
            continue
        out += c
        i += 1
    return bytes(out)


def _parse(line: bytes) -> Seen | None:
    """``<time> [<db> <client>] "ARG" "ARG" …``"""
    head, _, rest = line.partition(b"] ")
    if not rest:
        return None
    source = head.split(b" ")[-1].decode()
    args = tuple(_unescape(m) for m in _QUOTED.findall(rest))
    return Seen(source, args) if args else None


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[tuple[RedisServer, list[Seen]]]:
    server = RedisServer(tmp_path)
    server.start()
    seen: list[Seen] = []
    client = redis.Redis(port=server.port)
    monitor = client.monitor()
    monitor.__enter__()

    def listen() -> None:
        while True:
            try:
                line: Any = monitor.connection.read_response()
            except (redis.ConnectionError, OSError, ValueError, AttributeError):
                return
            parsed = _parse(line if isinstance(line, bytes) else str(line).encode())
            if parsed is not None:
                seen.append(parsed)

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    try:
        yield server, seen
    finally:
        server.stop()
        thread.join(5)
        client.close()


def _keys(probe: redis.Redis, seen: Seen) -> list[bytes]:
    if seen.name in {"MULTI", "EXEC", "DISCARD", "PUBLISH", "SUBSCRIBE", "PING", "SELECT"}:
        return []
    try:
        return list(probe.execute_command("COMMAND", "GETKEYS", *seen.args))
    except redis.ResponseError:  # no key arguments (INFO, SCRIPT LOAD, CLIENT …)
        return []


def _steps(seen: list[Seen]) -> list[list[Seen]]:
    """Commands grouped as Redis runs them atomically: a script with the commands it ran (they
    follow it, contiguous: nothing else runs meanwhile), a ``MULTI``…``EXEC`` of one client,
    and every other command alone."""
    steps: list[list[Seen]] = []
    open_tx: dict[str, list[Seen]] = {}
    for s in seen:
        if s.source == "lua":
            assert steps and steps[-1][0].name in {"EVAL", "EVALSHA"}, s
            steps[-1].append(s)
        elif s.name == "MULTI":
            open_tx[s.source] = []
        elif s.name == "EXEC" and s.source in open_tx:
            steps.append(open_tx.pop(s.source))
        elif s.source in open_tx:
            open_tx[s.source].append(s)
        else:
            steps.append([s])
    return steps


async def _traffic(tmp_path: Path, url: str) -> None:
    def edit(config: dict[str, Any]) -> None:
        config["redis"]["command_timeout_s"] = 5.0  # MONITOR slows the server down
        config["deployments"][0]["replicas"][0]["max_num_seqs"] = 8
        acme = config["tenants"]["acme"]
        acme["requests_per_minute"] = 10_000
        acme["tokens_per_minute"] = 10_000_000
        acme["budgets"] = [
            {"name": "monthly", "limit_usd": "500", "window": "month", "mode": "hard"},
            {"name": "weekly", "limit_usd": "50", "window": "7d", "mode": "soft"},
        ]

    async with inprocess_gateway(url, "tgslots", tmp_path, time_scale=0.01, edit=edit) as (
        _services,
        _app,
        client,
    ):

        async def one(i: int) -> None:
            body: dict[str, Any] = {
                "model": SMALL if i % 2 else "auto",
                "messages": [{"role": "user", "content": f"question {i}"}],
                "max_tokens": 20,
                "stream": i % 3 == 0,
            }
            headers = {**ACME, "idempotency-key": f"k{i}"} if i % 4 == 1 else ACME
            answer = await client.post("/v1/chat/completions", json=body, headers=headers)
            assert answer.status_code == 200, answer.text

        # More at once than the 8B's 8 slots: some start at once, the rest queue.
        await asyncio.gather(*(one(i) for i in range(24)))
        repeat = await client.post(
            "/v1/chat/completions",
            json={"model": SMALL, "messages": [{"role": "user", "content": "question 1"}]},
            headers={**ACME, "idempotency-key": "k1"},
        )
        assert repeat.status_code in (200, 409, 422), repeat.text
        await asyncio.sleep(1.0)  # the ledger sink, the snapshot, the renewals


async def test_every_script_and_multi_key_command_stays_in_one_slot(
    watched: tuple[RedisServer, list[Seen]], tmp_path: Path
) -> None:
    server, seen = watched
    await _traffic(tmp_path, server.url)
    probe = redis.Redis(port=server.port)
    probe.set_response_callback("COMMAND", lambda response, **_options: response)
    try:
        steps = _steps(list(seen))
        names = {s.name for step in steps for s in step}
        # The traffic reached the parts that use several keys at once.
        assert {"EVALSHA", "XADD", "XREADGROUP"} <= names, names
        scripts = [step for step in steps if step[0].name in {"EVAL", "EVALSHA"}]
        assert len(scripts) > 50 and sum(len(step) > 1 for step in scripts) > 50
        crossing = []
        for step in steps:
            keys = [k for s in step for k in _keys(probe, s)]
            if len({key_slot(k) for k in keys}) > 1:
                crossing.append([s.args[:1] + tuple(_keys(probe, s)) for s in step])
        assert not crossing, crossing[:5]
    finally:
        probe.close()
