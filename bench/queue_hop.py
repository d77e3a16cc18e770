"""Queue hop at 100 requests/s: enqueue -> worker start -> result relayed back to the edge.

The simulator answers with no modelled latency (``time_scale`` 0), so what is measured is the
queue itself: ``start`` = worker start minus enqueue (the ``queue_ms`` a worker reports),
``hop`` = the whole round trip at the edge minus the backend call's own time (``backend_ms``):
queued, the enqueue script, which hands the job to the idle worker with its claim (a take and a
claim of the worker's own when it is busy), the worker's wake-up, and the relay to the waiter: in
memory, since the worker is in the edge's process as in ``tiergate serve``, or with
``--reply-stream`` through the edge's reply stream, as a worker of another process answers;
``--direct``, one start script and the relay in the process. One edge and one worker in this
process, one Redis; open-loop arrivals at ``--rate``.

    .venv/bin/python bench/queue_hop.py                 # writes bench/results/queue_hop.json
    .venv/bin/python bench/queue_hop.py --direct --out bench/results/queue_hop_direct.json
    .venv/bin/python bench/queue_hop.py --reply-stream --out bench/results/queue_hop_stream.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import time
from pathlib import Path
from typing import Any

try:
    from bench.queue_rig import final_reply, make_job, make_rig, pct
except ModuleNotFoundError:  # run as a script from the repo root
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.queue_rig import final_reply, make_job, make_rig, pct


async def main(args: argparse.Namespace) -> dict[str, Any]:
    rig = await make_rig(args.redis_url, replicas=1, capacity=64, time_scale=0.0, itl_s=0.0)
    worker = await rig.add_worker("w1", beside_edge=not args.reply_stream)
    rig.start_edge(max_depth=10_000, local=worker if args.direct else None)
    dispatcher = rig.dispatcher
    assert dispatcher is not None
    starts: list[float] = []
    hops: list[float] = []
    totals: list[float] = []

    async def one(n: int, record: bool) -> None:
        job = make_job(f"h{n}", tenant="t", priority="interactive", timeout_s=10, max_tokens=4)
        t0 = time.perf_counter()
        reply = await final_reply(dispatcher, job)
        total = time.perf_counter() - t0
        if record and reply.kind == "result":
            backend = (reply.meta.backend_ms or 0.0) / 1000
            starts.append(reply.meta.queue_ms / 1000)
            hops.append(max(total - backend, 0.0))
            totals.append(total)

    tasks = []
    warmup = int(args.rate)
    for n in range(warmup + args.requests):
        tasks.append(asyncio.create_task(one(n, n >= warmup)))
        await asyncio.sleep(1 / args.rate)
    await asyncio.gather(*tasks)
    await rig.close()

    def ms(values: list[float]) -> dict[str, float | None]:
        quantiles = {"p50": pct(values, 0.5), "p99": pct(values, 0.99)}
        return {k: None if v is None else round(v * 1000, 3) for k, v in quantiles.items()}

    return {
        "bench": "queue_hop",
        "path": "direct start (edge and worker in one process)" if args.direct else "queued",
        "replies": "reply stream" if args.reply_stream else "in memory (worker beside its edge)",
        "python": platform.python_version(),
        "rate_rps": args.rate,
        "requests": len(hops),
        "enqueue_to_worker_start_ms": ms(starts),
        "hop_without_backend_ms": ms(hops),
        "round_trip_ms": ms(totals),
        "targets": {
            "hop_p50_under_1ms": (pct(hops, 0.5) or 1) < 0.001,
            "hop_p99_under_3ms": (pct(hops, 0.99) or 1) < 0.003,
        },
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--direct",
        action="store_true",
        help="the edge's own worker starts jobs that need not wait (as `tiergate serve` does)",
    )
    parser.add_argument(
        "--reply-stream",
        action="store_true",
        help="answer through the edge's reply stream, as a worker of another process does "
        "(default: the worker is in the edge's process and hands replies over in memory)",
    )
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "queue_hop.json"
    )
    arguments = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    result = asyncio.run(main(arguments))
    arguments.out.parent.mkdir(parents=True, exist_ok=True)
    arguments.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
