"""What conversation affinity buys: the same multi-turn conversations through `tiergate serve`
against simulator replicas of one deployment, with `queue.affinity` off and then on. See
docs/bench.md ("The affinity bench").

    .venv/bin/python -m bench.affinity                     # ~40 s; bench/results/affinity.json
    .venv/bin/python -m bench.affinity --conversations 8 --turns 3 --out /tmp/affinity.json

Each conversation is a task sending its turns one after the other as streams, with the header
``x-tiergate-conversation-id``: turn k's messages are a system prompt shared by every
conversation, then the earlier turns (user message, the answer as received) and a new user
message. Messages are drawn from a seeded generator and the simulator's answers are
deterministic, so both runs send exactly the same requests. Each run starts fresh simulators
(cold prefix caches) and a fresh gateway; its figures: the prefix-cache hit rate from the
simulators' ``/metrics``, prefill tokens computed and saved, the time to first token as the
client sees it, throughput, and where each turn ran (the simulators' usage logs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import aiohttp
import orjson
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backends.sim import PROFILES  # noqa: E402
from bench.loadgen import pct  # noqa: E402
from bench.machine import run_identity  # noqa: E402
from tests.support import (  # noqa: E402
    TEST_KEYS,
    Proc,
    free_port,
    gateway_config,
    start_gateway,
    wait_http,
    wait_ready,
)

RESULTS = ROOT / "bench" / "results" / "affinity.json"
TENANT_KEY = TEST_KEYS["TIERGATE_KEY_ACME"]
TEXT = (
    "the report lists each region with its sales for the quarter and notes where the numbers "
    "went up or down compared with last year while the team also wrote about staffing new "
    "stores delays in shipping and a plan to open two more sites before the end of summer "
    "please check the figures against the ledger and tell me which regions need a closer look"
)
WORDS = tuple(TEXT.split())
COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")


# --- the load -------------------------------------------------------------------------------


def system_prompt(words: int) -> str:
    rng = random.Random("system")
    return "You are the analyst's assistant. " + " ".join(rng.choices(WORDS, k=words)) + "."


def user_message(conversation: int, turn: int, words: tuple[int, int]) -> str:
    rng = random.Random(f"{conversation}/{turn}")
    return " ".join(rng.choices(WORDS, k=rng.randint(*words))).capitalize() + "?"


@dataclass
class Turn:
    conversation: int
    turn: int
    request_id: str = ""
    ttft_s: float | None = None
    latency_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None


async def _stream(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str], t: Turn
) -> str:
    """Send one turn as a stream; fill ``t``; return the answer's text."""
    text: list[str] = []
    sent = time.perf_counter()
    async with http.post(url, json=body, headers=headers) as resp:
        t.request_id = resp.headers.get("x-request-id", "")
        if resp.status != 200:
            t.error = f"http_{resp.status}"
            await resp.read()
            return ""
        done = False
        async for line in resp.content:
            if line.startswith(b"data: [DONE]"):
                done = True
            elif line.startswith(b"data: {"):
                chunk = orjson.loads(line[6:])
                for choice in chunk.get("choices") or ():
                    piece = choice["delta"].get("content")
                    if piece and t.ttft_s is None:
                        t.ttft_s = time.perf_counter() - sent
                    text.append(piece or "")
                    t.finish_reason = choice.get("finish_reason") or t.finish_reason
                usage = chunk.get("usage")
                if usage:
                    t.prompt_tokens = usage["prompt_tokens"]
                    t.completion_tokens = usage["completion_tokens"]
    t.latency_s = time.perf_counter() - sent
    if not done or t.ttft_s is None:
        t.error = "incomplete_stream"
    return "".join(text)


async def conversation(
    http: aiohttp.ClientSession, url: str, args: argparse.Namespace, n: int, out: list[Turn]
) -> None:
    await asyncio.sleep(args.stagger_s * n / args.conversations)
    messages: list[dict[str, str]] = [
        {"role": "system", "content": system_prompt(args.system_words)}
    ]
    headers = {"authorization": f"Bearer {TENANT_KEY}", "x-tiergate-conversation-id": f"c{n}"}
    for k in range(args.turns):
        messages.append({"role": "user", "content": user_message(n, k, args.user_words)})
        body = {
            "model": args.profile,
            "messages": messages,
            "max_tokens": args.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        t = Turn(n, k)
        out.append(t)
        try:
            answer = await _stream(http, url, body, headers, t)
        except (aiohttp.ClientError, TimeoutError) as exc:
            t.error = type(exc).__name__
        if t.error is not None:
            return  # the conversation cannot go on without its answer
        messages.append({"role": "assistant", "content": answer})
        await asyncio.sleep(think_s(n, k, args.think_s))


async def warm_up(http: aiohttp.ClientSession, url: str, args: argparse.Namespace) -> int:
    """Single-turn streams on prompts of their own (nothing the measured load can hit), 8 at a
    time, so that the first measured requests do not pay for a cold process. Returns how many
    failed."""
    failed = 0

    async def one(i: int) -> None:
        nonlocal failed
        text = f"Warm-up {i}: " + user_message(-1 - i, 0, (20, 40))
        body = {
            "model": args.profile,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 4,
            "stream": True,
        }
        headers = {"authorization": f"Bearer {TENANT_KEY}", "x-tiergate-conversation-id": f"w{i}"}
        t = Turn(-1, i)
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            await _stream(http, url, body, headers, t)
        failed += t.error is not None or t.ttft_s is None

    for start in range(0, args.warmup, 8):
        await asyncio.gather(*(one(i) for i in range(start, min(start + 8, args.warmup))))
    return failed


def think_s(conversation: int, turn: int, mean_s: float) -> float:
    """The user's pause before the next turn: 0.5-1.5 x ``mean_s``, the same in every run."""
    return mean_s * random.Random(f"think {conversation}/{turn}").uniform(0.5, 1.5)


# --- the stack ------------------------------------------------------------------------------


@dataclass
class Stack:
    """Simulator replicas and one `tiergate serve`, as real processes, for one run."""

    args: argparse.Namespace
    workdir: Path
    affinity: bool
    sims: list[Proc] = field(default_factory=list)
    sim_ports: list[int] = field(default_factory=list)
    gateway: Proc | None = None
    port: int = 0
    prefix: str = field(default_factory=lambda: f"tgbench-aff-{uuid.uuid4().hex[:8]}")

    @property
    def slots(self) -> int:
        """Per replica: ``--max-num-seqs``, else the profile's batch size."""
        n: int = self.args.max_num_seqs or PROFILES[self.args.profile].max_num_seqs
        return n

    def usage_log(self, i: int) -> Path:
        return self.workdir / f"usage-{i}.jsonl"

    def start(self) -> None:
        a = self.args
        for i in range(a.replicas):
            port = free_port()
            cmd = [
                sys.executable, "-m", "gateway.cli", "sim", "--profile", a.profile,
                "--port", str(port), "--time-scale", str(a.time_scale),
                "--max-num-seqs", str(self.slots), "--usage-log", str(self.usage_log(i)),
            ]  # fmt: skip
            self.sims.append(Proc(cmd, self.workdir / f"sim-{i}.log"))
            self.sim_ports.append(port)
        for proc, port in zip(self.sims, self.sim_ports, strict=True):
            if not wait_http(f"http://127.0.0.1:{port}/health", 30):
                raise RuntimeError(f"simulator on {port} did not start:\n{proc.output()}")
        self.port = free_port()
        config = gateway_config(
            workdir=self.workdir,
            redis_url=a.redis_url,
            prefix=self.prefix,
            database_url=f"sqlite+aiosqlite:///{self.workdir / 'ledger.db'}",
            sim_ports={a.profile: self.sim_ports[0]},
            port=self.port,
            admin_port=free_port(),
            queue={"affinity": self.affinity},
        )
        data = yaml.safe_load(config.read_text())
        data["deployments"][0]["replicas"] = [
            {"url": f"http://127.0.0.1:{p}", "max_num_seqs": self.slots} for p in self.sim_ports
        ]
        config.write_text(yaml.safe_dump(data))
        self.gateway = start_gateway(config, self.workdir)
        wait_ready(self.gateway, f"http://127.0.0.1:{self.port}/readyz")

    def close(self) -> None:
        for proc in (self.gateway, *self.sims):
            if proc is not None and proc.popen.poll() is None:
                proc.popen.terminate()
        for proc in (self.gateway, *self.sims):
            if proc is not None:
                proc.stop()
        client = redis.Redis.from_url(self.args.redis_url)
        keys = list(client.scan_iter(match=f"{self.prefix}:*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])
        client.close()


@contextlib.contextmanager
def running(args: argparse.Namespace, workdir: Path, affinity: bool) -> Iterator[Stack]:
    stack = Stack(args, workdir, affinity)
    try:
        stack.start()
        yield stack
    finally:
        stack.close()
        if args.keep_logs is not None:
            dest = args.keep_logs / ("on" if affinity else "off")
            dest.mkdir(parents=True, exist_ok=True)
            for log in workdir.glob("*.log"):
                log.replace(dest / log.name)


async def sim_counters(http: aiohttp.ClientSession, port: int) -> dict[str, float]:
    async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
        text = await resp.text()
    return {
        s.name: float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in COUNTERS
    }


# --- one run and its figures ----------------------------------------------------------------


def ms(values: Sequence[float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        v = pct(list(values), q)
        out[name] = None if v is None else round(v * 1000, 2)
    return out


def served(stack: Stack) -> dict[str, tuple[int, int]]:
    """request id -> (replica, cached prompt tokens), from the simulators' usage logs."""
    out: dict[str, tuple[int, int]] = {}
    for i in range(len(stack.sims)):
        path = stack.usage_log(i)
        for line in path.read_bytes().splitlines() if path.exists() else ():
            row = orjson.loads(line)
            if row["status"] == 200:
                out[row["request_id"]] = (i, row["cached_tokens"])
    return out


def placement(
    turns: Sequence[Turn], where: dict[str, tuple[int, int]], block: int
) -> dict[str, Any]:
    """Where later turns ran, and whether they found their whole history cached: the full blocks
    of the previous turn's prompt and computed answer (all of it but the last token sampled when
    cut by length)."""
    by_key = {(t.conversation, t.turn): t for t in turns if t.error is None}
    later = same = history = 0
    for (c, k), t in by_key.items():
        prev = by_key.get((c, k - 1))
        if prev is None or t.request_id not in where or prev.request_id not in where:
            continue
        later += 1
        same += where[t.request_id][0] == where[prev.request_id][0]
        computed = prev.prompt_tokens + prev.completion_tokens
        computed -= prev.finish_reason == "length"
        history += where[t.request_id][1] >= computed // block * block
    replicas = Counter(where[t.request_id][0] for t in by_key.values() if t.request_id in where)
    return {
        "later_turns": later,
        "on_previous_turns_replica": round(same / later, 4) if later else None,
        "whole_history_cached": round(history / later, 4) if later else None,
        "requests_per_replica": [replicas[i] for i in range(max(replicas, default=-1) + 1)],
    }


async def run_once(args: argparse.Namespace, affinity: bool) -> dict[str, Any]:
    with (
        TemporaryDirectory(prefix="tiergate-affinity-") as tmp,
        running(args, Path(tmp), affinity) as stack,
    ):
        url = f"http://127.0.0.1:{stack.port}/v1/chat/completions"
        turns: list[Turn] = []
        timeout = aiohttp.ClientTimeout(total=120, sock_connect=5)
        async with aiohttp.ClientSession(
            timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
        ) as http:
            warmup_failed = await warm_up(http, url, args)
            before = [await sim_counters(http, p) for p in stack.sim_ports]
            started = time.perf_counter()
            await asyncio.gather(
                *(conversation(http, url, args, n, turns) for n in range(args.conversations))
            )
            wall = time.perf_counter() - started
            after = [await sim_counters(http, p) for p in stack.sim_ports]
        where = served(stack)  # before the stack and its folder go
    counters = [{k: a[k] - b.get(k, 0.0) for k in a} for a, b in zip(after, before, strict=True)]
    queries = sum(c.get(COUNTERS[0], 0.0) for c in counters)
    hits = sum(c.get(COUNTERS[1], 0.0) for c in counters)
    ok = [t for t in turns if t.error is None]
    ttfts = [t.ttft_s for t in ok if t.ttft_s is not None]
    later = [t.ttft_s for t in ok if t.ttft_s is not None and t.turn > 0]
    by_turn = []
    for k in range(args.turns):
        at_k = [t for t in ok if t.turn == k]
        cached = [where[t.request_id][1] for t in at_k if t.request_id in where]
        by_turn.append(
            {
                "turn": k + 1,
                "requests": len(at_k),
                "prompt_tokens_mean": round(sum(t.prompt_tokens for t in at_k) / len(at_k), 1)
                if at_k
                else None,
                "cached_tokens_mean": round(sum(cached) / len(cached), 1) if cached else None,
                "ttft_ms": ms([t.ttft_s for t in at_k if t.ttft_s is not None]),
            }
        )
    return {
        "affinity": affinity,
        "requests": len(turns),
        "ok": len(ok),
        "errors": dict(Counter(t.error for t in turns if t.error is not None)),
        "warmup_failed": warmup_failed,
        "wall_s": round(wall, 3),
        "throughput_rps": round(len(ok) / wall, 2),
        "output_tokens_per_s": round(sum(t.completion_tokens for t in ok) / wall, 1),
        "ttft_ms": ms(ttfts),
        "ttft_ms_turns_2_on": ms(later),
        "latency_ms": ms([t.latency_s for t in ok if t.latency_s is not None]),
        "prefix_cache": {
            "queries_tokens": int(queries),
            "hits_tokens": int(hits),
            "hit_rate": round(hits / queries, 4) if queries else None,
            "prefill_tokens": int(queries - hits),
            "per_replica_hit_rate": [
                round(c[COUNTERS[1]] / c[COUNTERS[0]], 4) if c.get(COUNTERS[0]) else None
                for c in counters
            ],
        },
        "placement": placement(turns, where, PROFILES[args.profile].block_size),
        "by_turn": by_turn,
    }


# --- the bench ------------------------------------------------------------------------------


def environment(args: argparse.Namespace) -> dict[str, Any]:
    return {
        **run_identity(),
        "settings": {k: v for k, v in vars(args).items() if k not in {"out", "keep_logs"}},
    }


def effect(off: dict[str, Any], on: dict[str, Any]) -> dict[str, Any]:
    def pair(*path: str) -> dict[str, Any]:
        values = []
        for run in (off, on):
            value: Any = run
            for key in path:
                value = value[key]
            values.append(value)
        return {"off": values[0], "on": values[1]}

    saved = off["prefix_cache"]["prefill_tokens"] - on["prefix_cache"]["prefill_tokens"]
    return {
        "hit_rate": pair("prefix_cache", "hit_rate"),
        "prefill_tokens": pair("prefix_cache", "prefill_tokens"),
        "prefill_tokens_saved_by_affinity": saved,
        "ttft_ms_p50": pair("ttft_ms", "p50"),
        "ttft_ms_p99": pair("ttft_ms", "p99"),
        "ttft_ms_turns_2_on_p50": pair("ttft_ms_turns_2_on", "p50"),
        "throughput_rps": pair("throughput_rps"),
        "whole_history_cached": pair("placement", "whole_history_cached"),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    results: dict[str, Any] = {"bench": "affinity", "environment": environment(args)}
    runs = {}
    for mode in args.order:
        runs[mode] = await run_once(args, affinity=mode == "on")
        r = runs[mode]
        print(
            f"affinity {mode}: {r['ok']}/{r['requests']} ok, hit rate "
            f"{r['prefix_cache']['hit_rate']}, TTFT p50/p99 {r['ttft_ms']['p50']}/"
            f"{r['ttft_ms']['p99']} ms, {r['throughput_rps']} req/s, history cached "
            f"{r['placement']['whole_history_cached']}",
            flush=True,
        )
    results["runs"] = runs
    results["effect"] = effect(runs["off"], runs["on"])
    results["clean"] = all(not r["errors"] and not r["warmup_failed"] for r in runs.values())
    results["wall_s"] = round(time.perf_counter() - started, 1)
    return results


def _words(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    return int(low), int(high or low)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    doc = (__doc__ or "").splitlines()[0]
    p = argparse.ArgumentParser(description=doc)
    p.add_argument("--conversations", type=int, default=40)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--replicas", type=int, default=3, help="simulator replicas (2-4 sensible)")
    p.add_argument("--max-num-seqs", type=int, help="slots per replica (default: the profile's)")
    p.add_argument("--profile", default="llama-3.1-8b-instruct", choices=sorted(PROFILES))
    p.add_argument("--time-scale", type=float, default=1.0, help="simulator latency multiplier")
    p.add_argument("--max-tokens", type=int, default=32, help="answer length cap per turn")
    p.add_argument("--system-words", type=int, default=200, help="shared system prompt size")
    p.add_argument("--user-words", type=_words, default=(120, 200), help="per user turn, LOW-HIGH")
    p.add_argument("--stagger-s", type=float, default=1.0, help="conversations start over this")
    p.add_argument("--think-s", type=float, default=0.5, help="mean pause between turns")
    p.add_argument("--warmup", type=int, default=48, help="requests before measuring, per run")
    p.add_argument("--order", nargs=2, default=["off", "on"], choices=["off", "on"])
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--keep-logs", type=Path, default=None, help="copy process logs here")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if sorted(args.order) != ["off", "on"]:
        p.error("--order needs both off and on")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    results = asyncio.run(run(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(orjson.dumps(results, option=orjson.OPT_INDENT_2).decode() + "\n")
    print(orjson.dumps(results["effect"], option=orjson.OPT_INDENT_2).decode())
    if not results["clean"]:
        print("errors: " + ", ".join(f"{m}: {r['errors']}" for m, r in results["runs"].items()))


if __name__ == "__main__":
    main()
