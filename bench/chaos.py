"""Chaos run: steady load through `tiergate serve` while simulated backends are killed,
restarted and faulted at random; then a quiet phase. Writes bench/results/chaos.json.

    .venv/bin/python bench/chaos.py                      # 120 s of chaos + 30 s after
    .venv/bin/python bench/chaos.py --chaos-s 30 --after-s 10 --out /tmp/chaos.json
    .venv/bin/python bench/chaos.py --workers 2 --requests 10000 \
        --out bench/results/chaos-ownership.json         # workers and Redis killed too

``--workers N``: the gateway runs as ``tiergate serve --no-workers`` with N ``tiergate worker``
processes, and Redis with its append-only file; besides the simulators' faults the chaos actor
kills a worker (SIGKILL, a new one 1-3 s later) or Redis itself (SIGKILL, restarted on its AOF
0.5-2 s later). ``--requests``: the chaos phase lasts until that many requests were answered.
Each answer is then reconciled with its ledger row and the simulators' usage logs:
``contradicting`` (the row's status or outcome is not what the client got), ``double_run`` (the
simulators served more complete answers for the request than its row books). Of those two and
``served_not_booked_ok``, the ``…_at_worker_kill`` figures count the requests whose extra
complete answer left its simulator within a second before a worker was killed (or half a second
after the signal): a run that had its answer and was killed before booking it, which no gateway
can close (docs/fallback.md). ``request_ids`` names the requests behind every non-zero count
(a client with no answer by its own tag, ``x-tiergate-tags``, which its row carries), and
``chaos_events`` when each worker and Redis was killed; ``--workdir`` keeps the logs, the usage
logs and the ledger database to read them by.

Its own redis-server (on a free port), three simulators (8B, 70B: vLLM flavour; gpt-4o-mini:
OpenAI flavour, through litellm) and one gateway process. ``--concurrency`` clients send
requests back to back through the official openai client: streamed or not, ``small``,
``large`` or ``auto``. Every 2-5 s the chaos actor picks a simulator and kills it (SIGKILL,
restarted 2-6 s later) or sets a random fault for 2-6 s (5xx, hang, cut stream, slow first
token, reset, 429, flapping, stall, malformed chunk).

Figures:
- ``success_rate``: answers complete with a normal finish_reason / all requests, per phase;
- ``lost``: requests that got no answer at all (no HTTP status, no error event) plus answered
  requests without a ledger row — must be 0;
- ``double_billed``: requests with more than one ledger row, or a row billing more than one
  complete answer — must be 0;
- ``token_mismatch``: ``ok`` attempts whose tokens differ from what the simulator's usage log
  says it served for that request (reconciling the ledger against the backends);
- latency p50/p99 (all requests, and ok only) during chaos and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import openai
import yaml
from openai.types.chat import ChatCompletionMessageParam

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.accounting.ledger import SqlLedger  # noqa: E402
from tests.support import (  # noqa: E402
    TEST_KEYS,
    Proc,
    RedisServer,
    free_port,
    gateway_config,
    start_gateway,
    start_sim,
    wait_http,
    wait_ready,
)

PROFILES = ("llama-3.1-8b-instruct", "llama-3.1-70b-instruct-awq", "gpt-4o-mini")
FAULTS: tuple[dict[str, Any], ...] = (
    {"error_status": 503},
    {"error_status": 500, "error_rate": 0.5},
    {"hang": True},
    {"cut_after_tokens": 15},
    {"slow_first_token_ms": 8000},
    {"reset": True},
    {"rate_limit": True, "retry_after": 1},
    {"flap": True, "error_status": 502},
    {"stall_after_tokens": 10, "stall_ms": 8000},
    {"malformed_after_tokens": 5},
    {"end_after_tokens": 8},
)
FALLBACK = {
    "tiers": {
        tier: {
            "retry": {"max_attempts": 2, "backoff_initial_s": 0.05, "retry_after_cap_s": 2},
            "timeouts": {"connect_s": 1, "first_token_s": 3, "stall_s": 2, "attempt_s": 10},
        }
        for tier in ("small", "large", "external")
    },
    "breaker": {"window_s": 10, "min_calls": 4, "failure_ratio": 0.5, "open_s": 3},
}
PROMPTS = (
    "What is the capital of France?",
    "Explain the difference between TCP and UDP.",
    "Write a short poem about the sea.",
    "Prove that there are infinitely many primes.",
    "Summarise the causes of the First World War in three sentences.",
)


@dataclass
class Result:
    started: float
    latency_s: float
    phase: str
    stream: bool
    outcome: str  # ok | http_<status> | stream_error | lost
    request_id: str | None
    tag: str = ""  # the client's own id for the request (its row's tag), also without an answer


class Cluster:
    def __init__(self, workdir: Path, seed: int, workers: int = 0) -> None:
        self.workdir = workdir
        self.rng = random.Random(seed)
        self.workers = workers
        self.worker_procs: dict[int, Proc | None] = {}
        self.worker_locks = {i: asyncio.Lock() for i in range(workers)}
        self.redis_lock = asyncio.Lock()
        self.config: Path | None = None
        self.redis = RedisServer(workdir, aof=workers > 0)
        self.ports = {p: free_port() for p in PROFILES}
        self.sims: dict[str, Proc | None] = {}
        self.usage: dict[str, Path] = {}
        self.gateway: Proc | None = None
        self.base_url = ""
        self.database_url = f"sqlite+aiosqlite:///{workdir / 'ledger.db'}"
        self.actions: Counter[str] = Counter()
        self.events: list[tuple[float, str]] = []  # (Unix s, action): to read a failure by
        self.locks = {p: asyncio.Lock() for p in PROFILES}

    def start(self) -> None:
        self.redis.start()
        for profile, port in self.ports.items():
            self.sims[profile], self.usage[profile] = start_sim(profile, port, self.workdir)
        port, admin = free_port(), free_port()
        config = gateway_config(
            workdir=self.workdir,
            redis_url=self.redis.url,
            prefix="chaos",
            database_url=self.database_url,
            sim_ports=self.ports,
            port=port,
            admin_port=admin,
            fallback=FALLBACK,
        )
        self.config = config
        if self.workers:
            self.gateway = start_gateway(config, self.workdir, "--no-workers")
            for i in range(self.workers):
                self.worker_procs[i] = self._start_worker(i)
        else:
            self.gateway = start_gateway(config, self.workdir)
        wait_ready(self.gateway, f"http://127.0.0.1:{port}/readyz")
        self.base_url = f"http://127.0.0.1:{port}"

    def _start_worker(self, i: int) -> Proc:
        """A ``tiergate worker`` with a config of its own (its own admin port)."""
        assert self.config is not None
        data = yaml.safe_load(self.config.read_text())
        data["server"]["admin_port"] = free_port()
        n = self.rng.getrandbits(32)
        path = self.workdir / f"worker-{i}-{n:08x}.yaml"
        path.write_text(yaml.safe_dump(data))
        args = [sys.executable, "-m", "gateway.cli", "worker", "--config", str(path)]
        return Proc(args, self.workdir / f"worker-{i}-{n:08x}.log", TEST_KEYS)

    async def kill_worker(self, i: int, hold: float) -> None:
        async with self.worker_locks[i]:
            proc = self.worker_procs.get(i)
            if proc is None:
                return
            proc.popen.kill()
            self.events.append((time.time(), f"kill worker-{i}"))
            proc.popen.wait()
            proc.stop()
            self.worker_procs[i] = None
            await asyncio.sleep(hold)
            self.worker_procs[i] = self._start_worker(i)

    async def crash_redis(self, hold: float) -> None:
        async with self.redis_lock:
            assert self.redis.proc is not None
            self.redis.proc.kill()  # SIGKILL: what its append-only file kept is all it has
            self.events.append((time.time(), "kill redis"))
            self.redis.proc.wait()
            self.redis.proc = None
            await asyncio.sleep(hold)
            await asyncio.get_running_loop().run_in_executor(None, self.redis.start)

    def stop(self) -> None:
        for worker in self.worker_procs.values():
            if worker is not None:
                worker.stop()
        if self.gateway is not None:
            self.gateway.stop()
        for proc in self.sims.values():
            if proc is not None:
                proc.stop()
        self.redis.stop()

    async def faults(self, profile: str, faults: dict[str, Any] | None) -> None:
        import aiohttp

        url = f"http://127.0.0.1:{self.ports[profile]}/admin/faults"
        try:
            async with aiohttp.ClientSession() as session:
                if faults:
                    await session.post(url, json=faults, timeout=aiohttp.ClientTimeout(total=3))
                else:
                    await session.delete(url, timeout=aiohttp.ClientTimeout(total=3))
        except (aiohttp.ClientError, TimeoutError):
            pass  # the simulator is down: nothing to set

    async def kill(self, profile: str) -> None:
        async with self.locks[profile]:
            proc = self.sims[profile]
            if proc is None:
                return
            proc.popen.kill()
            proc.popen.wait()
            proc.stop()
            self.sims[profile] = None

    async def revive(self, profile: str) -> None:
        async with self.locks[profile]:
            loop = asyncio.get_running_loop()
            for attempt in range(3):  # a loaded machine can be slow to start one
                if self.sims[profile] is not None:
                    return
                try:
                    proc = await loop.run_in_executor(None, self._start_sim, profile)
                except RuntimeError:
                    self.actions["revive_failed"] += 1
                    await asyncio.sleep(1 + attempt)
                    continue
                self.sims[profile] = proc
            if self.sims[profile] is None:
                raise RuntimeError(f"simulator {profile} would not restart")

    def _start_sim(self, profile: str) -> Proc:
        """Like ``tests.support.start_sim``, with a longer wait, and never leaving a process
        behind that might bind the port later."""
        port = self.ports[profile]
        proc = Proc(
            [sys.executable, "-m", "gateway.cli", "sim", "--profile", profile, "--port",
             str(port), "--time-scale", "0.05", "--usage-log", str(self.usage[profile])],
            self.workdir / f"sim-{profile}-{self.rng.getrandbits(32):08x}.log",
        )  # fmt: skip
        if not wait_http(f"http://127.0.0.1:{port}/health", 60):
            proc.stop()
            raise RuntimeError(f"simulator {profile} did not start:\n{proc.output()}")
        return proc

    async def chaos(self, phases: Phases) -> None:
        pending: list[asyncio.Task[None]] = []
        while time.monotonic() < phases.chaos_until:
            await asyncio.sleep(self.rng.uniform(2, 5))
            profile = self.rng.choice(PROFILES)
            hold = self.rng.uniform(2, 6)
            roll = self.rng.random()
            if self.workers and roll < 0.35:
                i = self.rng.randrange(self.workers)
                self.actions["kill_worker"] += 1
                pending.append(asyncio.create_task(self.kill_worker(i, self.rng.uniform(1, 3))))
            elif self.workers and roll < 0.5:
                self.actions["crash_redis"] += 1
                pending.append(asyncio.create_task(self.crash_redis(self.rng.uniform(0.5, 2))))
            elif self.rng.random() < 0.3:
                self.actions["kill"] += 1
                await self.kill(profile)
                pending.append(asyncio.create_task(self._later(hold, self.revive(profile))))
            else:
                fault = self.rng.choice(FAULTS)
                self.actions[next(iter(fault))] += 1
                await self.faults(profile, fault)
                pending.append(asyncio.create_task(self._later(hold, self.faults(profile, None))))
        await asyncio.gather(*pending)
        for profile in PROFILES:  # the quiet phase starts clean
            await self.revive(profile)
            await self.faults(profile, None)

    @staticmethod
    async def _later(delay: float, action: Any) -> None:
        await asyncio.sleep(delay)
        await action


async def one_request(
    client: openai.AsyncOpenAI, rng: random.Random, stream: bool, tag: str = ""
) -> tuple[str, str | None]:
    model = rng.choice(("small", "large", "auto"))
    headers = {"x-tiergate-tags": tag} if tag else None
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": rng.choice(PROMPTS)}]
    try:
        if not stream:
            raw = await client.chat.completions.with_raw_response.create(
                model=model, messages=messages, max_tokens=120, extra_headers=headers
            )
            completion = raw.parse()
            ok = completion.choices[0].finish_reason in ("stop", "length")
            return ("ok" if ok else "bad_finish"), raw.headers.get("x-request-id")
        raw_stream = await client.chat.completions.with_raw_response.create(
            model=model, messages=messages, max_tokens=120, stream=True, extra_headers=headers
        )
        request_id = raw_stream.headers.get("x-request-id")
        finish = None
        try:
            async for chunk in raw_stream.parse():
                for choice in chunk.choices:
                    finish = choice.finish_reason or finish
        except openai.APIError:
            return "stream_error", request_id
        return ("ok" if finish in ("stop", "length") else "bad_finish"), request_id
    except openai.APIStatusError as exc:
        return f"http_{exc.status_code}", exc.response.headers.get("x-request-id")
    except (openai.APIConnectionError, openai.APITimeoutError):
        return "lost", None


@dataclass
class Phases:
    """When the chaos ends and the run ends. ``requests`` > 0: the chaos lasts until that many
    requests were answered, then ``quiet_s`` of quiet."""

    chaos_until: float
    end: float
    requests: int = 0
    quiet_s: float = 0.0


async def load(cluster: Cluster, concurrency: int, phases: Phases, seed: int) -> list[Result]:
    results: list[Result] = []

    async def client_loop(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        async with openai.AsyncOpenAI(
            base_url=f"{cluster.base_url}/v1",
            api_key=TEST_KEYS["TIERGATE_KEY_ACME"],
            max_retries=0,
            timeout=90,
        ) as client:
            while True:
                now = time.monotonic()
                if phases.requests and len(results) >= phases.requests and now < phases.chaos_until:
                    phases.chaos_until, phases.end = now, now + phases.quiet_s
                if now >= phases.end:
                    return
                phase = "chaos" if now < phases.chaos_until else "after"
                stream = rng.random() < 0.5
                tag = f"c{i}-{len(results)}-{rng.getrandbits(32):08x}"
                outcome, request_id = await one_request(client, rng, stream, tag)
                results.append(
                    Result(now, time.monotonic() - now, phase, stream, outcome, request_id, tag)
                )

    await asyncio.gather(*(client_loop(i) for i in range(concurrency)))
    return results


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 1)


def _usage_lines(cluster: Cluster) -> dict[tuple[str, str], list[dict[str, Any]]]:
    lines: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for profile, path in cluster.usage.items():
        if not path.exists():
            continue
        for raw in path.read_text().splitlines():
            if not raw.strip():
                continue
            line = json.loads(raw)
            lines.setdefault((line["request_id"], profile), []).append(line)
    return lines


def _agrees(client: str, status: int, outcome: str) -> bool:
    """Whether a row (``status``, ``outcome``) says what its client got (``Result.outcome``)."""
    if client in ("ok", "bad_finish"):
        return status == 200 and outcome == "ok"
    if client == "stream_error":
        return status == 200 and outcome != "ok"
    if client.startswith("http_"):
        return status == int(client.removeprefix("http_"))
    return True  # no answer: nothing to contradict


class Tally:
    """What the reconciliation of each answer with its row and the usage logs found."""

    def __init__(
        self, usage: dict[tuple[str, str], list[dict[str, Any]]], kills: tuple[float, ...] = ()
    ) -> None:
        self.usage = usage
        self.kills = sorted(kills)
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, list[dict[str, Any]]] = {
            "token": [],
            "contradicting": [],
            "unbooked": [],
        }
        self.failures: Counter[str] = Counter()
        self.ids: dict[str, list[str]] = {}

    def _id(self, kind: str, request_id: str) -> None:
        self.ids.setdefault(kind, []).append(request_id)

    def _example(self, kind: str, example: dict[str, Any]) -> None:
        if len(self.examples[kind]) < 5:  # what a failed reconciliation needs to be read
            self.examples[kind].append(example)

    def _near_kill(self, ts: float) -> bool:
        """Whether a backend's last byte went out in the second before a worker was killed
        (or just after the signal: a loaded host delivers it late): the window in which a run
        has its answer and has not booked it yet. Nothing in the gateway can close it (the
        backend served; the run that would book it is gone), so it is counted apart."""
        return any(-0.5 <= kill - ts <= 1.0 for kill in self.kills)

    def check(self, r: Result, entry: Any) -> None:
        assert r.request_id is not None
        if r.outcome != "ok":
            self.failures[" > ".join(a.outcome for a in entry.attempts) or "(none)"] += 1
        ok_attempts = [a for a in entry.attempts if a.outcome == "ok"]
        if len(ok_attempts) > 1:
            self.counts["double_billed"] += 1
        if not _agrees(r.outcome, entry.status_code, entry.outcome):
            self.counts["contradicting"] += 1
            self._id("contradicting", r.request_id)
            self._example(
                "contradicting",
                {"request_id": r.request_id, "client": r.outcome,
                 "row": [entry.status_code, entry.outcome, entry.provisional]},
            )  # fmt: skip
        complete = [
            line
            for profile in PROFILES
            for line in self.usage.get((r.request_id, profile), [])
            if line.get("status") == 200 and line.get("finish_reason") in ("stop", "length")
        ]
        self.counts["double_run"] += len(complete) > 1
        at_kill = any(self._near_kill(line["ts"]) for line in complete)
        if len(complete) > 1 and at_kill:
            self.counts["double_run_at_worker_kill"] += 1
        if len(complete) > 1:
            self._id("double_run", r.request_id)
        if len(complete) > len(ok_attempts):
            self.counts["served_not_booked_ok"] += 1
            if at_kill:
                self.counts["served_not_booked_ok_at_worker_kill"] += 1
            self._id("served_not_booked_ok", r.request_id)
            self._example(
                "unbooked",
                {"request_id": r.request_id, "client": r.outcome,
                 "row": [entry.status_code, entry.outcome, entry.provisional],
                 "attempts": [a.to_dict() for a in entry.attempts], "served": complete},
            )  # fmt: skip
        for attempt in ok_attempts:
            served = [
                line
                for line in self.usage.get((r.request_id, attempt.deployment), [])
                if line.get("status") == 200 and line.get("finish_reason") != "abort"
            ]
            self.counts["checked"] += 1
            tokens = served[0].get("completion_tokens") if len(served) == 1 else None
            if tokens != attempt.completion_tokens:
                self.counts["mismatched"] += 1
                self._id("token_mismatch", r.request_id)
                self._example(
                    "token",
                    {"request_id": r.request_id,
                     "attempts": [a.to_dict() for a in entry.attempts],
                     "served_by_the_simulator": served},
                )  # fmt: skip


async def reconcile(cluster: Cluster, results: list[Result]) -> dict[str, Any]:
    ledger = await SqlLedger.connect(cluster.database_url)
    kills = tuple(t for t, what in cluster.events if what.startswith("kill worker"))
    tally = Tally(_usage_lines(cluster), kills)
    missing_rows = 0
    try:
        for r in results:
            if r.request_id is None:
                continue
            entry = None
            for _ in range(100):  # the sink books asynchronously
                entry = await ledger.get(r.request_id)
                if entry is not None:
                    break
                await asyncio.sleep(0.1)
            if entry is None:
                missing_rows += 1
                tally._id("answered_without_ledger_row", r.request_id)
                continue
            tally.check(r, entry)
    finally:
        await ledger.aclose()
    counts = tally.counts
    return {
        "answered_without_ledger_row": missing_rows,
        "double_billed": counts["double_billed"],
        "contradicting": counts["contradicting"],
        "contradicting_examples": tally.examples["contradicting"],
        "double_run": counts["double_run"],
        "served_not_booked_ok": counts["served_not_booked_ok"],
        "served_not_booked_ok_at_worker_kill": counts["served_not_booked_ok_at_worker_kill"],
        "double_run_at_worker_kill": counts["double_run_at_worker_kill"],
        "served_not_booked_ok_examples": tally.examples["unbooked"],
        "ok_attempts_checked_against_usage_logs": counts["checked"],
        "token_mismatch": counts["mismatched"],
        "token_mismatch_examples": tally.examples["token"],
        "failed_requests_by_attempts": dict(tally.failures.most_common(8)),
        "request_ids": tally.ids,
    }


def summarise(results: list[Result], recon: dict[str, Any], cluster: Cluster) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for phase in ("chaos", "after"):
        rs = [r for r in results if r.phase == phase]
        ok = [r for r in rs if r.outcome == "ok"]
        out[phase] = {
            "requests": len(rs),
            "ok": len(ok),
            "success_rate": round(len(ok) / len(rs), 4) if rs else None,
            "outcomes": dict(Counter(r.outcome for r in rs)),
            "latency_ms_p50": _pct([r.latency_s for r in rs], 0.5),
            "latency_ms_p99": _pct([r.latency_s for r in rs], 0.99),
            "ok_latency_ms_p99": _pct([r.latency_s for r in ok], 0.99),
        }
    lost_no_answer = sum(1 for r in results if r.outcome == "lost")
    recon["request_ids"]["lost_no_answer"] = [
        f"tag:{r.tag} stream={r.stream} t={r.latency_s:.1f}s"
        for r in results
        if r.outcome == "lost"
    ]
    return {
        **out,
        "lost": lost_no_answer + recon["answered_without_ledger_row"],
        "lost_no_answer": lost_no_answer,
        **recon,
        "chaos_actions": dict(cluster.actions),
        "chaos_events": [(round(t, 3), what) for t, what in cluster.events],
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    with TemporaryDirectory(prefix="tiergate-chaos-") as tmp_dir:
        workdir = Path(args.workdir or tmp_dir)
        workdir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (before anything runs)
        cluster = Cluster(workdir, args.seed, workers=getattr(args, "workers", 0))
        cluster.start()
        try:
            start = time.monotonic()
            requests = getattr(args, "requests", 0)
            if requests:
                phases = Phases(math.inf, math.inf, requests, args.after_s)
            else:
                chaos_until = start + args.chaos_s
                phases = Phases(chaos_until, chaos_until + args.after_s)
            chaos = asyncio.create_task(cluster.chaos(phases))
            results = await load(cluster, args.concurrency, phases, args.seed)
            await chaos
            recon = await reconcile(cluster, results)
            summary = summarise(results, recon, cluster)
        finally:
            cluster.stop()
    return {
        "run": {
            "id": uuid.uuid4().hex[:8],
            "chaos_s": None if getattr(args, "requests", 0) else args.chaos_s,
            "requests": getattr(args, "requests", 0) or None,
            "workers": getattr(args, "workers", 0),
            "after_s": args.after_s,
            "concurrency": args.concurrency,
            "seed": args.seed,
            "time_scale": 0.05,
        },
        **summary,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chaos-s", type=float, default=120)
    parser.add_argument("--after-s", type=float, default=30)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=0, help="worker processes (0: serve)")
    parser.add_argument("--requests", type=int, default=0, help="chaos until this many")
    parser.add_argument("--workdir", type=Path, default=None, help="keep logs and DB here")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "chaos.json")
    args = parser.parse_args()
    report = asyncio.run(main_async(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    sys.stdout.write(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
