"""Overload: an interactive tenant at 0.5x capacity and a batch tenant at 2.5x, for 60 s.

Two simulator replicas (``max_num_seqs`` 8 each, ~1 s per request) behind two worker
"processes" (own pools and lease owners, one Redis) and one edge, all in this process. Open-loop
Poisson arrivals. Reports the interactive tenant's queue wait (p50/p99), every request's final
status (answered, 429, 504 — nothing may be lost), and the peak in-flight per replica (seen by a
counting middleware in the simulator, and as slot leases in Redis), which must stay at or under
capacity.

    .venv/bin/python bench/queue_overload.py     # writes bench/results/queue_overload.json
    .venv/bin/python bench/queue_overload.py --seconds 10 --out /tmp/q.json
    .venv/bin/python bench/queue_overload.py --no-deadline-admission   # as before admission
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import platform
import random
import time
from pathlib import Path
from typing import Any

from gateway.errors import GatewayError
from gateway.settings import QueueSettings

try:
    from bench.queue_rig import final_reply, make_job, make_rig, pct, sample_peak
except ModuleNotFoundError:  # run as a script from the repo root
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.queue_rig import final_reply, make_job, make_rig, pct, sample_peak


async def main(args: argparse.Namespace) -> dict[str, Any]:
    rig = await make_rig(
        args.redis_url, replicas=2, capacity=args.capacity, time_scale=1.0, itl_s=args.itl_s
    )
    await rig.add_worker("w1")
    await rig.add_worker("w2")
    rig.start_edge(
        max_depth=args.max_depth,
        deadline_admission=args.deadline_admission,
        deadline_margin=args.deadline_margin,
    )
    dispatcher = rig.dispatcher
    assert dispatcher is not None
    service_s = 0.02 + args.max_tokens * args.itl_s
    capacity_rps = 2 * args.capacity / service_s
    rates = {"interactive": 0.5 * capacity_rps, "batch": 2.5 * capacity_rps}
    outcomes: dict[str, collections.Counter[str]] = {k: collections.Counter() for k in rates}
    refusals: dict[str, collections.Counter[str]] = {k: collections.Counter() for k in rates}
    waits: dict[str, list[float]] = {k: [] for k in rates}
    lost: list[str] = []
    stop = asyncio.Event()
    peak_leases: dict[str, int] = {}
    sampler = asyncio.create_task(sample_peak(rig, stop, peak_leases))
    calls: list[asyncio.Task[None]] = []
    rng = random.Random(7)

    async def one(lane: str, n: int) -> None:
        job = make_job(
            f"{lane}-{n}", tenant=lane, priority=lane, timeout_s=args.timeout_s,
            max_tokens=args.max_tokens,
        )  # fmt: skip
        try:
            reply = await asyncio.wait_for(final_reply(dispatcher, job), args.timeout_s + 15)
        except GatewayError as exc:
            outcomes[lane][str(exc.status)] += 1
            refusals[lane][exc.code] += 1  # queue_full, deadline_unreachable, …
            return
        except TimeoutError:
            lost.append(job.request_id)
            return
        status = 200 if reply.kind == "result" else reply.meta.status or 0
        outcomes[lane][str(status)] += 1
        if status == 200:
            waits[lane].append(reply.meta.queue_ms / 1000)

    async def arrivals(lane: str) -> None:
        n = 0
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            await asyncio.sleep(rng.expovariate(rates[lane]))
            calls.append(asyncio.create_task(one(lane, n)))
            n += 1

    started = time.monotonic()
    await asyncio.gather(*(arrivals(lane) for lane in rates))
    await asyncio.gather(*calls)
    stop.set()
    await sampler
    elapsed = time.monotonic() - started
    sims = rig.sims
    booked = collections.Counter(e.request_id for e in rig.books.entries)
    await rig.close()
    sent = len(calls)
    accounted = sum(sum(c.values()) for c in outcomes.values())
    inter = waits["interactive"]
    return {
        "bench": "queue_overload",
        "python": platform.python_version(),
        "seconds": args.seconds,
        "deadline_admission": args.deadline_admission,
        "deadline_margin": args.deadline_margin,
        "elapsed_s": round(elapsed, 1),
        "replicas": 2,
        "capacity_per_replica": args.capacity,
        "service_s_model": service_s,
        "capacity_rps": round(capacity_rps, 1),
        "rates_rps": {k: round(v, 1) for k, v in rates.items()},
        "sent": sent,
        "accounted": accounted,
        "lost": len(lost),
        "booked_twice": sum(1 for n in booked.values() if n > 1),
        "outcomes": {k: dict(v) for k, v in outcomes.items()},
        "refusals_by_code": {k: dict(v) for k, v in refusals.items()},
        "interactive_queue_wait_s": {
            "p50": pct(inter, 0.5),
            "p99": pct(inter, 0.99),
            "max": max(inter, default=None),
        },
        "batch_queue_wait_s": {"p50": pct(waits["batch"], 0.5), "p99": pct(waits["batch"], 0.99)},
        "peak_inflight_at_replica": [s.peak for s in sims],
        "peak_slot_leases": list(peak_leases.values()),
        "targets": {
            "interactive_p99_wait_under_1s": (pct(inter, 0.99) or 0) < 1.0,
            "nothing_lost": not lost and accounted == sent,
            "inflight_within_capacity": all(s.peak <= args.capacity for s in sims),
        },
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--capacity", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--itl-s", type=float, default=0.02)
    parser.add_argument("--timeout-s", type=float, default=10.0)
    parser.add_argument("--max-depth", type=int, default=200)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--no-deadline-admission",
        dest="deadline_admission",
        action="store_false",
        help="queue what cannot start in time (it gets 504 at its deadline), as before",
    )
    parser.add_argument("--deadline-margin", type=float, default=QueueSettings().deadline_margin)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "queue_overload.json"
    )
    arguments = parser.parse_args()
    result = asyncio.run(main(arguments))
    arguments.out.parent.mkdir(parents=True, exist_ok=True)
    arguments.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
