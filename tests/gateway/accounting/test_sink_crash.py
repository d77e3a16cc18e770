"""Killing the ledger sink (SIGKILL, mid-drain) loses and duplicates nothing: real Redis, real
SQLite, the sink in its own process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from sqlalchemy import create_engine, text

from gateway.accounting.events import encode_entry
from tests.gateway.accounting.factories import make_entry
from tests.support import wait_until

pytestmark = pytest.mark.slow
EVENTS = 6000
ROOT = Path(__file__).resolve().parents[3]


def _count(db: Path) -> int:
    engine = create_engine(f"sqlite:///{db}")
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM ledger_entries")).scalar_one())
    except Exception:  # noqa: BLE001 (the table appears when the sink has migrated)
        return 0
    finally:
        engine.dispose()


def _sink(redis_url: str, stream: str, db: Path, name: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.gateway.accounting.sink_proc", redis_url, stream,
         f"sqlite+aiosqlite:///{db}", name],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


@pytest.mark.timeout(180)
def test_sigkill_mid_drain_loses_and_duplicates_nothing(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(redis_url)
    stream = f"{key_prefix}:{{ledger}}:events"
    db = tmp_path / "ledger.db"
    pipe = client.pipeline(transaction=False)
    for i in range(EVENTS):
        pipe.xadd(stream, {"e": encode_entry(make_entry(f"req-{i}"))})
        if i % 10 == 0:  # at-least-once in: some events are delivered twice
            pipe.xadd(stream, {"e": encode_entry(make_entry(f"req-{i}"))})
    pipe.execute()
    first = _sink(redis_url, stream, db, "sink-a")
    try:
        wait_until(lambda: _count(db) > 300, 60, what="the first sink booked nothing")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    killed_at = _count(db)
    assert killed_at < EVENTS, "the sink finished before it was killed; use more events"
    # A new process has a new consumer name (as in tiergate serve/worker): it must claim the
    # dead sink's read-but-unacknowledged events.
    assert (
        client.xpending(stream, "ledger")["pending"] > 0
        or _count(db) + client.xlen(stream) >= EVENTS
    )
    second = _sink(redis_url, stream, db, "sink-b")
    try:
        wait_until(
            lambda: _count(db) == EVENTS and client.xlen(stream) == 0,
            120,
            what="the second sink did not book every event",
        )
    finally:
        second.terminate()
        second.wait(10)
    assert _count(db) == EVENTS
    engine = create_engine(f"sqlite:///{db}")
    with engine.connect() as conn:
        ids = conn.execute(text("SELECT request_id FROM ledger_entries")).scalars().all()
    engine.dispose()
    assert sorted(ids) == sorted(f"req-{i}" for i in range(EVENTS))
    client.close()
