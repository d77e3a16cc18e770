"""Chaos run: steady load through `tiergate serve` while simulated backends are killed,
restarted and faulted at random; then a quiet phase. Writes bench/results/chaos.json.

    .venv/bin/python bench/chaos.py                      # 120 s of chaos + 30 s after
    .venv/bin/python bench/chaos.py --chaos-s 30 --after-s 10 --out /tmp/chaos.json

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


class Cluster:
    def __init__(self, workdir: Path, seed: int) -> None:
        self.workdir = workdir
        self.rng = random.Random(seed)
        self.redis = RedisServer(workdir)
        self.ports = {p: free_port() for p in PROFILES}
        self.sims: dict[str, Proc | None] = {}
        self.usage: dict[str, Path] = {}
        self.gateway: Proc | None = None
        self.base_url = ""
        self.database_url = f"sqlite+aiosqlite:///{workdir / 'ledger.db'}"
        self.actions: Counter[str] = Counter()
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
        self.gateway = start_gateway(config, self.workdir)
        wait_ready(self.gateway, f"http://127.0.0.1:{port}/readyz")
        self.base_url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
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

    async def chaos(self, until: float) -> None:
        pending: list[asyncio.Task[None]] = []
        while time.monotonic() < until:
            await asyncio.sleep(self.rng.uniform(2, 5))
            profile = self.rng.choice(PROFILES)
            hold = self.rng.uniform(2, 6)
            if self.rng.random() < 0.3:
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
    client: openai.AsyncOpenAI, rng: random.Random, stream: bool
) -> tuple[str, str | None]:
    model = rng.choice(("small", "large", "auto"))
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": rng.choice(PROMPTS)}]
    try:
        if not stream:
            raw = await client.chat.completions.with_raw_response.create(
                model=model, messages=messages, max_tokens=120
            )
            completion = raw.parse()
            ok = completion.choices[0].finish_reason in ("stop", "length")
            return ("ok" if ok else "bad_finish"), raw.headers.get("x-request-id")
        raw_stream = await client.chat.completions.with_raw_response.create(
            model=model, messages=messages, max_tokens=120, stream=True
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


async def load(
    cluster: Cluster, concurrency: int, chaos_until: float, end: float, seed: int
) -> list[Result]:
    results: list[Result] = []

    async def client_loop(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        async with openai.AsyncOpenAI(
            base_url=f"{cluster.base_url}/v1",
            api_key=TEST_KEYS["TIERGATE_KEY_ACME"],
            max_retries=0,
            timeout=90,
        ) as client:
            while (now := time.monotonic()) < end:
                phase = "chaos" if now < chaos_until else "after"
                stream = rng.random() < 0.5
                outcome, request_id = await one_request(client, rng, stream)
                results.append(
                    Result(now, time.monotonic() - now, phase, stream, outcome, request_id)
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


async def reconcile(cluster: Cluster, results: list[Result]) -> dict[str, Any]:
    ledger = await SqlLedger.connect(cluster.database_url)
    usage = _usage_lines(cluster)
    missing_rows = double_billed = mismatched = checked = 0
    examples: list[dict[str, Any]] = []
    failures: Counter[str] = Counter()
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
                continue
            if r.outcome != "ok":
                failures[" > ".join(a.outcome for a in entry.attempts) or "(none)"] += 1
            ok_attempts = [a for a in entry.attempts if a.outcome == "ok"]
            if len(ok_attempts) > 1:
                double_billed += 1
            for attempt in ok_attempts:
                served = [
                    line
                    for line in usage.get((r.request_id, attempt.deployment), [])
                    if line.get("status") == 200 and line.get("finish_reason") != "abort"
                ]
                checked += 1
                if len(served) != 1 or served[0].get("completion_tokens") != (
                    attempt.completion_tokens
                ):
                    mismatched += 1
                    if len(examples) < 5:  # what a failed reconciliation needs to be read
                        examples.append(
                            {
                                "request_id": r.request_id,
                                "attempts": [a.to_dict() for a in entry.attempts],
                                "served_by_the_simulator": served,
                            }
                        )
    finally:
        await ledger.aclose()
    return {
        "answered_without_ledger_row": missing_rows,
        "double_billed": double_billed,
        "ok_attempts_checked_against_usage_logs": checked,
        "token_mismatch": mismatched,
        "token_mismatch_examples": examples,
        "failed_requests_by_attempts": dict(failures.most_common(8)),
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
    return {
        **out,
        "lost": lost_no_answer + recon["answered_without_ledger_row"],
        "lost_no_answer": lost_no_answer,
        **recon,
        "chaos_actions": dict(cluster.actions),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    with TemporaryDirectory(prefix="tiergate-chaos-") as tmp:
        cluster = Cluster(Path(tmp), args.seed)
        cluster.start()
        try:
            start = time.monotonic()
            chaos_until = start + args.chaos_s
            end = chaos_until + args.after_s
            chaos = asyncio.create_task(cluster.chaos(chaos_until))
            results = await load(cluster, args.concurrency, chaos_until, end, args.seed)
            await chaos
            recon = await reconcile(cluster, results)
            summary = summarise(results, recon, cluster)
        finally:
            cluster.stop()
    return {
        "run": {
            "id": uuid.uuid4().hex[:8],
            "chaos_s": args.chaos_s,
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
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "chaos.json")
    args = parser.parse_args()
    report = asyncio.run(main_async(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    sys.stdout.write(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
