"""Conversation affinity: a conversation's turns stay on its home replica while it has room,
the same home in every process (rendezvous hashing), on the direct and the queued path."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
import yaml

from backends.scripted import ScriptedBackend
from gateway.app import create_app
from gateway.queue.edge.dispatcher import Dispatcher
from gateway.queue.edge.replies import ReplyRouter
from gateway.queue.keys import RedisKeys
from gateway.queue.replicas.affinity import home_first, home_of
from gateway.queue.replicas.capacity import SlotLeases
from gateway.queue.replicas.pool import BackendPool, Replica
from gateway.rules.sticky import conversation_key
from gateway.services import open_services
from gateway.settings import load_settings
from tests.gateway.queue.conftest import MODEL, Collect, Edge, job, start_node
from tests.support import free_port, gateway_config


def _replicas(n: int) -> list[Replica]:
    return [
        Replica(ScriptedBackend(f"{MODEL}#{i}", []), 4)  # never called: placement only
        for i in range(n)
    ]


def test_homes_are_stable_spread_and_move_only_when_their_replica_goes() -> None:
    three = _replicas(3)
    keys = [f"conv-{i}" for i in range(600)]
    homes = {k: home_of(k, three) for k in keys}
    counts = [sum(1 for h in homes.values() if h is r) for r in three]
    assert all(150 < c < 250 for c in counts), counts  # spread
    assert all(home_of(k, list(reversed(three))) is homes[k] for k in keys)  # order-free
    two = three[:2]  # replica #2 is gone
    moved = [k for k in keys if home_of(k, two) is not homes[k]]
    assert moved and all(homes[k] is three[2] for k in moved)  # only its conversations move
    ranked = [three[1], three[2], three[0]]
    key = next(k for k in keys if homes[k] is three[0])
    assert home_first(ranked, three, key) == [three[0], three[1], three[2]]
    assert home_first(ranked[:2], three, key) == ranked[:2]  # home not usable: no change
    assert home_first(ranked, three, None) == ranked


async def test_with_affinity_off_conversation_keys_change_nothing() -> None:
    three = _replicas(3)
    for i, replica in enumerate(three):
        replica.slot_key = f"slots-{i}"
    key = next(k for k in (f"conv-{i}" for i in range(100)) if home_of(k, three) is three[2])
    for affinity, first in ((True, three[2]), (False, three[0])):
        pool = BackendPool({MODEL: three}, affinity=affinity)  # least loaded: in config order
        assert pool.ranked(MODEL, affinity=key)[0] is first
        reservation = await pool.reserve([MODEL])
        assert reservation is not None and reservation.replica is three[0]
        async with pool.holding(reservation), pool.lease(MODEL, affinity=key) as backend:
            assert backend is first.backend  # moved home, or kept where it was reserved
        assert all(r.inflight == 0 for r in three)


def _served_by(sims, request_ids: list[str]) -> set[int]:  # type: ignore[no-untyped-def]
    return {i for i, sim in enumerate(sims) for r in sim.served if r in request_ids}


async def test_turns_stay_on_the_home_replica_on_both_paths_and_leave_it_when_full(
    redis_conn: aioredis.Redis,
    key_prefix: str,
    start_sim,
    edge: Edge,  # type: ignore[no-untyped-def]
) -> None:
    sims = [await start_sim(4, time_scale=0.0) for _ in range(2)]
    keys = RedisKeys(key_prefix)
    booked = Collect()
    node = await start_node(redis_conn, keys, sims, booked, "w1")
    replies = ReplyRouter(redis_conn, keys.replies("local"))
    direct = Dispatcher(redis_conn, keys, replies, max_depth=100, claim_ttl_s=60, local=node.worker)
    used: set[int] = set()
    try:
        for c in range(6):
            conversation = f"conversation-{c}"
            ids = []
            for turn in range(4):
                request_id = f"c{c}t{turn}"
                ids.append(request_id)
                j = dataclasses.replace(job(request_id, "local"), conversation=conversation)
                # Turns alternate between the direct path and the queue (another edge).
                if turn % 2:
                    await edge.call(dataclasses.replace(j, reply_to=edge.edge_id))
                else:
                    [_ async for _ in await direct.submit(j)]
            home = home_of(conversation, node.pool.replicas(MODEL))
            at_home = node.pool.replicas(MODEL).index(home)  # type: ignore[arg-type]
            assert _served_by(sims, ids) == {at_home}, (conversation, [s.served for s in sims])
            used.add(at_home)
        assert used == {0, 1}  # the conversations' homes spread over both replicas
        # The home is full: the turn goes to the other replica rather than wait.
        home = home_of("conversation-0", node.pool.replicas(MODEL))
        assert home is not None
        index = node.pool.replicas(MODEL).index(home)
        leases = SlotLeases(redis_conn)
        taken = [await leases.acquire(home.slot_key, f"busy-{n}", 4) for n in range(4)]
        assert not taken[-1]  # full (the worker's idle reservation may hold one of its slots)
        j = dataclasses.replace(job("full", "local"), conversation="conversation-0")
        [_ async for _ in await direct.submit(j)]
        assert _served_by(sims, ["full"]) == {1 - index}
    finally:
        await node.aclose()


@pytest.mark.parametrize("affinity", [True, False])
async def test_the_queue_affinity_setting_decides_where_turns_go(
    tmp_path: Path,
    redis_url: str,
    key_prefix: str,
    start_sim,  # type: ignore[no-untyped-def]
    affinity: bool,
) -> None:
    # Non-streamed answers at time scale 0 hold no slot across an await, so a /metrics scrape
    # never sees one running: by load alone, sequential requests always rank the replicas the
    # same way (the worker's idle reservation holds a slot on one of them).
    sims = [await start_sim(8, time_scale=0.0) for _ in range(2)]
    path = gateway_config(
        workdir=tmp_path,
        redis_url=redis_url,
        prefix=key_prefix,
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'tiergate.db'}",
        sim_ports={MODEL: 1},
        port=free_port(),
        admin_port=free_port(),
        queue={"affinity": affinity},
    )
    config = yaml.safe_load(path.read_text())
    config["deployments"][0]["replicas"] = [{"url": s.url, "max_num_seqs": 8} for s in sims]
    path.write_text(yaml.safe_dump(config))
    homes = {}
    for c in range(6):
        key = conversation_key(f"conv-{c}", [])
        assert key is not None
        home = home_of(key, _replicas(2))
        assert home is not None
        homes[f"conv-{c}"] = int(home.backend.name.rsplit("#", 1)[1])
    assert set(homes.values()) == {0, 1}
    async with open_services(load_settings(path), dev=True, workers=True) as services:
        app = create_app(services=services)
        app.state.services = services  # (the ASGI transport runs no lifespan)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://tiergate") as client:
            await asyncio.sleep(0.5)  # both replicas scraped: both fresh
            served: dict[str, set[int]] = {}
            for turn in range(2):
                for conversation in homes:
                    reply = await client.post(
                        "/v1/chat/completions",
                        json={
                            "model": MODEL,
                            "messages": [{"role": "user", "content": f"turn {turn}"}],
                            "max_tokens": 2,
                        },
                        headers={
                            "authorization": "Bearer dev-acme",
                            "x-tiergate-conversation-id": conversation,
                        },
                    )
                    assert reply.status_code == 200, reply.text
                    request_id = reply.headers["x-request-id"]
                    where = {i for i, sim in enumerate(sims) if request_id in sim.served}
                    served.setdefault(conversation, set()).update(where)
    if affinity:
        assert served == {c: {home} for c, home in homes.items()}
    else:  # one replica for all, although their homes are on both
        (only,) = {frozenset(where) for where in served.values()}
        assert len(only) == 1
