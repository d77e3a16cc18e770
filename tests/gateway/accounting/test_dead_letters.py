"""A ledger event the ledger cannot book is set aside; the events around it are booked.

Real Redis (the event stream, the dead-letter stream), real SQLite and PostgreSQL. One event
PostgreSQL refuses (a NUL byte in its app; a token count out of range on both databases) used to
fail its whole batch on every retry and so stop booking for every tenant."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from sqlalchemy.exc import SQLAlchemyError

from gateway.accounting import SqlLedger
from gateway.accounting.dead_letters import DeadLetter, DeadLetters, is_poison, storable
from gateway.accounting.events import encode_entry
from gateway.accounting.sink import LedgerSink
from gateway.accounting.verify import verify_ledger
from gateway.sqlengine import create_sql_engine
from tests.gateway.accounting.factories import T0, make_entry


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


def make_sink(
    redis: aioredis.Redis, prefix: str, ledger: SqlLedger, counted: list[str]
) -> LedgerSink:
    return LedgerSink(
        redis=redis,
        blocking_redis=redis,
        stream=f"{prefix}:ledger",
        group="ledger",
        consumer="sink-1",
        ledger=ledger,
        dead_letters=DeadLetters(ledger.engine),
        dead_letter_stream=f"{prefix}:ledger:dead",
        on_dead_letter=counted.append,
    )


async def test_poison_and_malformed_events_are_set_aside_and_the_rest_booked(
    redis: aioredis.Redis, key_prefix: str, ledger: SqlLedger
) -> None:
    stream = f"{key_prefix}:ledger"
    good = [make_entry(f"good-{i}", created_at=T0) for i in range(5)]
    out_of_range = make_entry("huge", prompt_tokens=2**63)  # over BIGINT: refused by both databases
    await redis.xadd(stream, {"e": encode_entry(good[0])})
    await redis.xadd(stream, {"e": encode_entry(out_of_range)})
    await redis.xadd(stream, {"e": encode_entry(good[1])})
    await redis.xadd(stream, {"e": b"\xff not json"})
    await redis.xadd(stream, {"other": b"no e field"})
    for entry in good[2:]:
        await redis.xadd(stream, {"e": encode_entry(entry)})
    counted: list[str] = []
    sink = make_sink(redis, key_prefix, ledger, counted)

    assert await sink.drain() == 5

    for entry in good:
        assert await ledger.get(entry.request_id) == entry
    assert await ledger.get("huge") is None
    assert await redis.xlen(stream) == 0  # acknowledged and deleted: nothing retried forever
    pending = await redis.xpending(stream, "ledger")
    assert pending["pending"] == 0
    assert sorted(counted) == ["malformed", "malformed", "refused"]
    letters = await DeadLetters(ledger.engine).latest()
    assert len(letters) == 3 and await DeadLetters(ledger.engine).count() == 3
    refused = [d for d in letters if d.request_id == "huge"]
    assert len(refused) == 1 and refused[0].tenant == "acme"
    assert refused[0].reason.startswith("refused by SQL")
    assert '"request_id":"huge"' in refused[0].event
    dead = await redis.xrange(f"{key_prefix}:ledger:dead")
    assert sorted(fields[b"id"].decode() for _id, fields in dead) == sorted(
        d.stream_id for d in letters
    )


@pytest.mark.postgres
async def test_a_nul_byte_does_not_stop_booking_on_postgresql(
    redis: aioredis.Redis, key_prefix: str, pg_url: str
) -> None:
    """The probe of issue 20: ``"model": "sm\\u0000all"`` and a NUL in the app or a tag."""
    ledger = await SqlLedger.connect(pg_url)
    try:
        stream = f"{key_prefix}:ledger"
        poisoned = [
            make_entry(f"nul-model-{key_prefix}", requested_model="sm\x00all", tier=None),
            make_entry(f"nul-app-{key_prefix}", app="a\x00pp"),
            make_entry(f"nul-tag-{key_prefix}", tags=("t\x00",)),
        ]
        fine = [make_entry(f"fine-{i}-{key_prefix}") for i in range(3)]
        for poison, ok in zip(poisoned, fine, strict=True):
            await redis.xadd(stream, {"e": encode_entry(poison)})
            await redis.xadd(stream, {"e": encode_entry(ok)})
        counted: list[str] = []

        assert await make_sink(redis, key_prefix, ledger, counted).drain() == 3

        for entry in fine:
            assert await ledger.get(entry.request_id) == entry
        assert counted == ["refused"] * 3
        letters = {d.request_id: d for d in await DeadLetters(ledger.engine).latest()}
        for poison in poisoned:
            assert "\\u0000" in letters[poison.request_id].event
            assert "\x00" not in letters[poison.request_id].event
    finally:
        await ledger.aclose()


async def test_a_database_that_is_away_pauses_the_sink_and_sets_nothing_aside(
    redis: aioredis.Redis, key_prefix: str, tmp_path: object
) -> None:
    """Only a refusal for what an event holds makes a dead letter; the database being away
    leaves every event in the stream for the next try."""
    away = SqlLedger(create_sql_engine("postgresql+asyncpg://postgres@127.0.0.1:9/none"))
    stream = f"{key_prefix}:ledger"
    await redis.xadd(stream, {"e": encode_entry(make_entry("r1"))})
    counted: list[str] = []
    try:
        with pytest.raises((OSError, SQLAlchemyError)):
            await make_sink(redis, key_prefix, away, counted).drain()
    finally:
        await away.aclose()
    assert counted == []
    assert await redis.xlen(stream) == 1
    assert await redis.xlen(f"{key_prefix}:ledger:dead") == 0


@pytest.mark.parametrize(
    ("error", "poison"),
    [
        (OverflowError("Python int too large to convert to SQLite INTEGER"), True),
        (ConnectionRefusedError(), False),
    ],
)
def test_is_poison_tells_the_event_s_fault_from_the_database_s(
    error: Exception, poison: bool
) -> None:
    assert is_poison(error) is poison


def test_storable_escapes_what_sql_text_cannot_hold() -> None:
    assert storable("a\x00b") == "a\\u0000b"
    assert storable("lone \ud800 surrogate") == "lone \\ud800 surrogate"
    assert storable("plain é") == "plain é"


def test_a_dead_letter_reads_what_it_can_of_its_event() -> None:
    letter = DeadLetter.of("1-0", b'{"request_id": "r\\u0000", "tenant": 7}', "why", T0)
    assert letter.request_id == "r\\u0000" and letter.tenant is None
    unreadable = DeadLetter.of("2-0", b"\xff\x00", "why", T0)
    assert unreadable.request_id is None and unreadable.event == "\\xff\\u0000"


async def test_verify_lists_each_dead_letter_as_a_difference(
    redis: aioredis.Redis, key_prefix: str, ledger: SqlLedger
) -> None:
    assert (await verify_ledger(ledger)).ok
    await redis.xadd(
        f"{key_prefix}:ledger", {"e": encode_entry(make_entry("big", prompt_tokens=2**63))}
    )
    await make_sink(redis, key_prefix, ledger, []).drain()
    report = await verify_ledger(ledger)
    assert not report.ok and report.dead_letters == 1
    assert [d.check for d in report.differences] == ["dead letters"]
    assert "request big" in report.differences[0].detail
