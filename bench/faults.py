"""Fault scenarios: one request per fault class through `tiergate serve`, the shipped fault
settings (deploy/config.example.yaml's ``fallback``) and per-deployment fallback chains, each
judged pass / partial / fail. Writes bench/results/faults.json.

    .venv/bin/python bench/faults.py
    .venv/bin/python bench/faults.py --legacy-config --out /tmp/faults-before.json

The scenarios are those of the issue's held-out benchmark (as its text describes them; the
benchmark itself is not here): 429 with and without ``Retry-After``, 500, 503, connection
reset, no response, slow first token, streams cut at 40 and 60 tokens, a stall, a malformed
chunk, a missing ``[DONE]``, context length, content filter, a flapping primary, and the billing
of failed attempts. Each request names a deployment; its chain is the only place another
answer may come from (``unrelated`` counts answers from elsewhere, which fail the scenario).

A scenario passes when the client gets what a correct gateway gives it (a complete answer from
the deployment or its chain, text equal to the unfaulted answer where a stream was continued,
or the honest error: 400 ``context_length_exceeded``, 429 with ``Retry-After``), in time (under
the client's 60 s timeout), and its ledger row agrees (one row; the attempts the fault caused;
tokens as the simulators logged them). Partial: answered correctly but the row or the status
disagrees. Fail: anything else.

``--legacy-config`` drops the config keys older versions reject (``fallbacks``, ``first_byte_s``,
``attempt_share``), to measure a gateway from before them on the same scenarios.

Its own redis-server, three simulators (8B and 70B in vLLM's dialect, gpt-4o-mini in OpenAI's,
through litellm) at ``time_scale`` 0.05, one gateway process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import openai
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.accounting.records import LedgerEntry  # noqa: E402
from tests.support import (  # noqa: E402
    TEST_KEYS,
    Proc,
    RedisServer,
    free_port,
    gateway_config,
    start_gateway,
    start_sim,
    wait_ready,
)
from tests.support.ledger import wait_entry  # noqa: E402

SMALL, LARGE, EXTERNAL = "llama-3.1-8b-instruct", "llama-3.1-70b-instruct-awq", "gpt-4o-mini"
CHAINS = {SMALL: [LARGE], LARGE: [SMALL], EXTERNAL: [LARGE]}
PROMPT = "Explain how a circuit breaker protects a distributed system, in detail."
CLIENT_TIMEOUT_S = 60.0


@dataclass
class Seen:
    """What the client got."""

    status: int = 200
    text: str = ""
    finish: str | None = None
    model: str | None = None
    request_id: str | None = None
    error: str | None = None
    code: str | None = None
    retry_after: str | None = None
    usage: tuple[int, int] | None = None
    elapsed_s: float = 0.0


@dataclass
class Verdict:
    scenario: str
    result: str  # pass | partial | fail
    why: str
    elapsed_s: float
    served_by: str | None
    unrelated: bool
    attempts: list[str] = field(default_factory=list)


class Stack:
    def __init__(self, workdir: Path, legacy: bool, by_tier: bool = False) -> None:
        self.by_tier = by_tier
        self.workdir = workdir
        self.redis = RedisServer(workdir)
        self.ports = {p: free_port() for p in (SMALL, LARGE, EXTERNAL)}
        self.sims: dict[str, Proc] = {}
        self.usage: dict[str, Path] = {}
        self.gateway: Proc | None = None
        self.base_url = ""
        self.database_url = f"sqlite+aiosqlite:///{workdir / 'ledger.db'}"
        self.legacy = legacy

    def start(self) -> None:
        self.redis.start()
        for profile, port in self.ports.items():
            self.sims[profile], self.usage[profile] = start_sim(profile, port, self.workdir)
        port, admin = free_port(), free_port()
        path = gateway_config(
            workdir=self.workdir,
            redis_url=self.redis.url,
            prefix="faults",
            database_url=self.database_url,
            sim_ports=self.ports,
            port=port,
            admin_port=admin,
        )
        config = yaml.safe_load(path.read_text())
        for dep in config["deployments"]:
            dep["fallbacks"] = CHAINS[dep["model"]]
        if self.legacy:
            for dep in config["deployments"]:
                dep.pop("fallbacks", None)
            config["fallback"].pop("attempt_share", None)
            for tier in config["fallback"]["tiers"].values():
                tier["timeouts"].pop("first_byte_s", None)
        path.write_text(yaml.safe_dump(config))
        self.gateway = start_gateway(path, self.workdir)
        wait_ready(self.gateway, f"http://127.0.0.1:{port}/readyz")
        self.base_url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()
        for proc in self.sims.values():
            proc.stop()
        self.redis.stop()

    def faults(self, profile: str, **faults: Any) -> None:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.ports[profile]}/admin/faults",
            data=json.dumps(faults).encode(),
            method="POST" if faults else "DELETE",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 200

    def logged(self, profile: str, request_id: str) -> list[dict[str, Any]]:
        path = self.usage[profile]
        if not path.exists():
            return []
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [line for line in lines if line.get("request_id") == request_id]

    async def ask(self, model: str, *, stream: bool, prompt: str = PROMPT) -> Seen:
        if self.by_tier:
            model = BY_TIER.get(model, model)
        seen = Seen()
        started = time.monotonic()
        client = openai.AsyncOpenAI(
            base_url=f"{self.base_url}/v1",
            api_key=TEST_KEYS["TIERGATE_KEY_ACME"],
            max_retries=0,
            timeout=CLIENT_TIMEOUT_S,
        )
        messages: Any = [{"role": "user", "content": prompt}]
        try:
            if stream:
                raw = await client.chat.completions.with_raw_response.create(
                    model=model, messages=messages, max_tokens=300, stream=True,
                    stream_options={"include_usage": True},
                )  # fmt: skip
                seen.model = raw.headers.get("x-tiergate-model")
                seen.request_id = raw.headers.get("x-request-id")
                pieces: list[str] = []
                async for chunk in raw.parse():
                    if chunk.usage is not None:
                        seen.usage = (chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
                    for choice in chunk.choices:
                        pieces.append(choice.delta.content or "")
                        seen.finish = choice.finish_reason or seen.finish
                seen.text = "".join(pieces)
            else:
                raw_json = await client.chat.completions.with_raw_response.create(
                    model=model, messages=messages, max_tokens=300
                )
                completion = raw_json.parse()
                seen.model = raw_json.headers.get("x-tiergate-model")
                seen.request_id = raw_json.headers.get("x-request-id")
                seen.text = completion.choices[0].message.content or ""
                seen.finish = completion.choices[0].finish_reason
                if completion.usage is not None:
                    seen.usage = (
                        completion.usage.prompt_tokens,
                        completion.usage.completion_tokens,
                    )
        except openai.APIStatusError as exc:
            seen.status = exc.status_code
            seen.error = exc.message
            seen.code = exc.code
            seen.retry_after = exc.response.headers.get("retry-after")
            seen.request_id = exc.response.headers.get("x-request-id")
        except openai.APIError as exc:  # an error event inside a stream
            seen.error = exc.message
            seen.finish = "error"
        finally:
            seen.elapsed_s = time.monotonic() - started
            await client.close()
        return seen

    async def row(self, seen: Seen) -> LedgerEntry | None:
        if seen.request_id is None:
            return None
        try:
            return await wait_entry(self.database_url, seen.request_id)
        except (AssertionError, TimeoutError):
            return None


BY_TIER = {SMALL: "small", LARGE: "large", EXTERNAL: "external"}
"""``--by-tier``: each request names the deployment's tier instead (the tier order then decides
where it may go, so no answer is unrelated)."""


def allowed_for(named: str) -> set[str]:
    return {named, *CHAINS[named]}


def attempts(row: LedgerEntry | None) -> list[str]:
    return [f"{a.deployment}:{a.outcome}" for a in row.attempts] if row else []


def judge(
    stack: Stack, name: str, named: str, seen: Seen, row: LedgerEntry | None, problems: list[str]
) -> Verdict:
    """``problems``: what the scenario's own checks found wrong with the row or the status of
    an otherwise correct answer (partial); a wrong answer is a failure."""
    allowed = set(BY_TIER) if stack.by_tier else allowed_for(named)
    served = row.deployment if row is not None else seen.model
    unrelated = served is not None and served not in allowed
    answered = seen.status == 200 and seen.finish not in (None, "error")
    if seen.elapsed_s >= CLIENT_TIMEOUT_S - 1:
        result, why = "fail", "the client timed out"
    elif unrelated:
        result, why = "fail", f"answered by {served}, outside {named}'s chain"
    elif problems:
        result, why = "partial", "; ".join(problems)
    else:
        said = f"answered ({seen.finish})" if answered else f"honest {seen.status} {seen.code}"
        result, why = "pass", said
    return Verdict(name, result, why, round(seen.elapsed_s, 2), served, unrelated, attempts(row))


Scenario = Callable[[Stack], Awaitable[Verdict]]


async def _answered(
    stack: Stack, name: str, named: str, *, stream: bool, reference: str | None = None
) -> Verdict:
    seen = await stack.ask(named, stream=stream)
    row = await stack.row(seen)
    problems: list[str] = []
    if seen.status != 200 or seen.finish in (None, "error") or not seen.text:
        problems.append(f"no complete answer ({seen.status}, {seen.finish}, {seen.error})")
    if reference is not None and seen.text != reference:
        problems.append("the text differs from the unfaulted answer")
    if row is None:
        problems.append("no ledger row")
    elif row.outcome != "ok":
        problems.append(f"row outcome {row.outcome}")
    elif seen.usage is not None and seen.usage != (row.prompt_tokens, row.completion_tokens):
        problems.append(
            f"usage {seen.usage} != ledger {(row.prompt_tokens, row.completion_tokens)}"
        )
    verdict = judge(stack, name, named, seen, row, problems)
    if problems and (seen.status != 200 or not seen.text or seen.finish in (None, "error")):
        verdict.result = "fail"
    return verdict


async def _reference(stack: Stack, named: str) -> str:
    return (await stack.ask(named, stream=True)).text


def scenario_faulted(
    name: str, profile: str, named: str, faults: dict[str, Any], *, stream: bool, same: bool
) -> Scenario:
    async def run(stack: Stack) -> Verdict:
        reference = await _reference(stack, named) if same else None
        stack.faults(profile, **faults)
        try:
            return await _answered(stack, name, named, stream=stream, reference=reference)
        finally:
            stack.faults(profile)

    return run


async def persistent_429(stack: Stack) -> Verdict:
    """Every deployment rate limited: the client gets 429 and a Retry-After."""
    for profile in (SMALL, LARGE, EXTERNAL):
        stack.faults(profile, rate_limit=True, retry_after=2)
    try:
        seen = await stack.ask(SMALL, stream=False)
    finally:
        for profile in (SMALL, LARGE, EXTERNAL):
            stack.faults(profile)
    row = await stack.row(seen)
    problems = []
    if seen.status != 429:
        problems.append(f"status {seen.status}, not 429")
    if seen.retry_after is None:
        problems.append("no Retry-After")
    if seen.error and "#" in seen.error:
        problems.append("an internal tag in the message")
    return judge(stack, "429 everywhere (Retry-After kept)", SMALL, seen, row, problems)


async def context_length(stack: Stack) -> Verdict:
    """A prompt over the 70B's 8,192 tokens, the 70B named: its chain (the 8B, 16,384) answers;
    with no chain, the honest answer is 400 ``context_length_exceeded``."""
    seen = await stack.ask(LARGE, stream=False, prompt="word " * 9000)
    row = await stack.row(seen)
    problems = []
    if seen.status == 200:
        if not seen.text:
            problems.append("empty answer")
    elif (seen.status, seen.code) != (400, "context_length_exceeded"):
        problems.append(f"status {seen.status} {seen.code}")
    return judge(stack, "context length", LARGE, seen, row, problems)


async def content_filter(stack: Stack) -> Verdict:
    stack.faults(EXTERNAL, content_filter=True)
    try:
        seen = await stack.ask(EXTERNAL, stream=True)
    finally:
        stack.faults(EXTERNAL)
    row = await stack.row(seen)
    problems = []
    if seen.finish != "content_filter":
        problems.append(f"finish_reason {seen.finish}")
    if len(attempts(row)) != 1:
        problems.append(f"attempts {attempts(row)}")
    return judge(stack, "content filter", EXTERNAL, seen, row, problems)


async def flapping(stack: Stack) -> Verdict:
    stack.faults(SMALL, flap=True, error_status=503)
    try:
        seens = [await stack.ask(SMALL, stream=i % 2 == 1) for i in range(8)]
    finally:
        stack.faults(SMALL)
    rows = [await stack.row(s) for s in seens]
    problems = [f"request {i}: {s.status} {s.finish}" for i, s in enumerate(seens)
                if s.status != 200 or s.finish in (None, "error")]  # fmt: skip
    verdict = judge(stack, "flapping primary", SMALL, seens[-1], rows[-1], problems)
    allowed = set(BY_TIER) if stack.by_tier else allowed_for(SMALL)
    verdict.unrelated = any(
        r is not None and r.deployment is not None and r.deployment not in allowed for r in rows
    )
    verdict.elapsed_s = round(sum(s.elapsed_s for s in seens), 2)
    if verdict.unrelated:
        verdict.result = "fail"
    return verdict


async def billing(stack: Stack) -> Verdict:
    """A stream cut at 40 tokens and continued: the row books both attempts as the simulators
    logged them, and the client's usage is the row's."""
    stack.faults(SMALL, cut_after_tokens=40)
    try:
        seen = await stack.ask(SMALL, stream=True)
    finally:
        stack.faults(SMALL)
    row = await stack.row(seen)
    problems = []
    if row is None or seen.request_id is None:
        problems.append("no row")
    else:
        (cut_log,) = stack.logged(SMALL, seen.request_id) or [{}]
        (rest_log,) = stack.logged(LARGE, seen.request_id) or [{}]
        booked = {a.deployment: a for a in row.attempts}
        if SMALL not in booked or not 0 < booked[SMALL].completion_tokens <= 40:
            problems.append("the cut attempt is not booked")
        if LARGE not in booked or booked[LARGE].completion_tokens != rest_log.get(
            "completion_tokens"
        ):
            problems.append("the continuation is not booked as logged")
        if cut_log.get("completion_tokens") != 40:
            problems.append("the simulator did not cut at 40")
        if seen.usage != (row.prompt_tokens, row.completion_tokens):
            problems.append(f"client usage {seen.usage} != ledger")
    return judge(stack, "billing of failed attempts", SMALL, seen, row, problems)


def scenarios() -> list[tuple[str, Scenario]]:
    def faulted(name: str, faults: dict[str, Any], *, stream: bool, same: bool = False) -> Any:
        return name, scenario_faulted(name, SMALL, SMALL, faults, stream=stream, same=same)

    return [
        faulted("429 with Retry-After", {"rate_limit": True, "retry_after": 1}, stream=False),
        faulted("429 without Retry-After", {"flap": True, "error_status": 429}, stream=False),
        faulted("500", {"error_status": 500}, stream=False),
        faulted("503", {"error_status": 503}, stream=True),
        faulted("connection reset", {"reset": True}, stream=False),
        ("no response (70B named, non-streamed)",
         scenario_faulted("no response (70B named, non-streamed)", LARGE, LARGE,
                          {"hang": True}, stream=False, same=False)),
        faulted("slow first token (20 s)", {"slow_first_token_ms": 20_000}, stream=True),
        faulted("stream cut at 40 tokens", {"cut_after_tokens": 40}, stream=True, same=True),
        faulted("stream cut at 60 tokens", {"cut_after_tokens": 60}, stream=True, same=True),
        faulted("stall (30 s after 40 tokens)", {"stall_after_tokens": 40, "stall_ms": 30_000},
                stream=True, same=True),
        faulted("malformed chunk", {"malformed_after_tokens": 10}, stream=True, same=True),
        faulted("missing [DONE]", {"omit_done": True}, stream=True, same=True),
        ("context length", context_length),
        ("content filter", content_filter),
        ("flapping primary", flapping),
        ("billing of failed attempts", billing),
        ("429 everywhere (Retry-After kept)", persistent_429),
    ]  # fmt: skip


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    with TemporaryDirectory(prefix="tiergate-faults-") as tmp:
        stack = Stack(Path(tmp), args.legacy_config, args.by_tier)
        stack.start()
        verdicts: list[Verdict] = []
        try:
            for name, run in scenarios():
                if args.only and args.only not in name:
                    continue
                verdict = await run(stack)
                verdicts.append(verdict)
                print(f"{verdict.result:8} {verdict.elapsed_s:6.1f}s  {name}: {verdict.why}")
                await asyncio.sleep(6)  # breakers that opened close (open_s 5) before the next
        finally:
            stack.stop()
    counts = {r: sum(v.result == r for v in verdicts) for r in ("pass", "partial", "fail")}
    return {
        "legacy_config": args.legacy_config,
        "by_tier": args.by_tier,
        "scenarios": len(verdicts),
        **counts,
        "unrelated": sum(v.unrelated for v in verdicts),
        "verdicts": [asdict(v) for v in verdicts],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--legacy-config", action="store_true")
    parser.add_argument("--by-tier", action="store_true", help="name tiers, not deployments")
    parser.add_argument("--only", default="", help="run the scenarios whose name contains this")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "faults.json")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "verdicts"}))


if __name__ == "__main__":
    main()
