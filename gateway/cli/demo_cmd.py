"""``tiergate demo``: the whole stack on one machine, real traffic, and what routing saved."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Container
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gateway.accounting.ledger import SqlLedger
from gateway.accounting.records import LedgerEntry
from gateway.cli.demo_prompts import DEMO_TRAFFIC, DemoRequest
from gateway.cli.ports import stack_endpoints, taken
from gateway.cli.up_cmd import ports_taken_message, wait_http_ok
from gateway.settings import Settings, load_settings

__all__ = ["demo"]

_CONCURRENCY = 6


@dataclass
class _Result:
    request: DemoRequest
    request_id: str
    tier: str
    rule: str
    model: str
    latency_ms: float
    error: str | None = None


def _tenant_key(settings: Settings, tenant: str) -> str:
    spec = settings.tenants[tenant]
    key = os.environ.get(spec.key_env) or spec.dev_key
    if key is None:
        typer.echo(f"no key for tenant {tenant}: set {spec.key_env}", err=True)
        raise typer.Exit(2)
    return key


async def _send(settings: Settings, base_url: str, item: DemoRequest) -> _Result:
    import openai

    started = time.perf_counter()
    async with openai.AsyncOpenAI(
        base_url=base_url, api_key=_tenant_key(settings, item.tenant), max_retries=0, timeout=120
    ) as api:
        messages: Any = [{"role": "user", "content": item.prompt}]
        try:
            if item.stream:
                raw_stream = await api.chat.completions.with_raw_response.create(
                    model="auto", messages=messages, max_tokens=200, stream=True
                )
                headers = raw_stream.headers
                async for _chunk in raw_stream.parse():
                    pass
            else:
                raw = await api.chat.completions.with_raw_response.create(
                    model="auto", messages=messages, max_tokens=200
                )
                headers = raw.headers
        except openai.APIError as exc:
            return _Result(
                item, "", "-", "-", "-", (time.perf_counter() - started) * 1000, str(exc)
            )
    return _Result(
        request=item,
        request_id=headers.get("x-request-id", ""),
        tier=headers.get("x-tiergate-tier", "?"),
        rule=headers.get("x-tiergate-rule", "?"),
        model=headers.get("x-tiergate-model", "?"),
        latency_ms=(time.perf_counter() - started) * 1000,
    )


async def _traffic(settings: Settings, base_url: str) -> list[_Result]:
    gate = asyncio.Semaphore(_CONCURRENCY)

    async def one(item: DemoRequest) -> _Result:
        async with gate:
            return await _send(settings, base_url, item)

    return list(await asyncio.gather(*(one(item) for item in DEMO_TRAFFIC)))


async def _entries(database_url: str, results: list[_Result]) -> dict[str, LedgerEntry]:
    ledger = await SqlLedger.connect(database_url)
    found: dict[str, LedgerEntry] = {}
    try:
        deadline = time.monotonic() + 15
        wanted = {r.request_id for r in results if r.request_id}
        while wanted - found.keys() and time.monotonic() < deadline:
            for request_id in wanted - found.keys():
                entry = await ledger.get(request_id)
                if entry is not None:
                    found[request_id] = entry
            await asyncio.sleep(0.2)
    finally:
        await ledger.aclose()
    return found


def _money(amount: Decimal | None) -> str:
    return "unknown" if amount is None else f"${amount:.6f}"


def _print(console: Console, results: list[_Result], entries: dict[str, LedgerEntry]) -> None:
    table = Table(title="tiergate demo: one row per request", show_lines=False)
    widths = {"tenant": 7, "prompt": 34, "stream": 6, "tier": 8, "why": 24, "model": 26,
              "tokens in/out": 13, "cost": 9, "latency": 8}  # fmt: skip
    for column, width in widths.items():
        table.add_column(column, no_wrap=True, overflow="ellipsis", min_width=width)
    for result in results:
        entry = entries.get(result.request_id)
        prompt = result.request.prompt.replace("\n", " ")
        why = result.rule
        if entry is not None and entry.score is not None:
            why = f"{result.rule} {entry.score:.2f}"
        table.add_row(
            result.request.tenant,
            prompt[:33] + ("…" if len(prompt) > 33 else ""),
            "yes" if result.request.stream else "no",
            result.tier,
            result.error or why,
            result.model,
            f"{entry.prompt_tokens}/{entry.completion_tokens}" if entry else "-",
            _money(entry.cost_usd) if entry else "-",
            f"{result.latency_ms / 1000:.2f} s",
        )
    console.print(table)

    totals: dict[str, list[Decimal]] = defaultdict(lambda: [Decimal(0), Decimal(0)])
    for entry in entries.values():
        totals[entry.tenant][0] += entry.cost_usd or Decimal(0)
        totals[entry.tenant][1] += entry.baseline_usd or Decimal(0)
    summary = Table(title="cost per tenant: as routed vs. everything on the large tier")
    for column in ("tenant", "requests", "cost as routed", "cost on large tier", "saved"):
        summary.add_column(column, justify="right")
    grand = [Decimal(0), Decimal(0)]
    for tenant in sorted(totals):
        cost, baseline = totals[tenant]
        grand[0] += cost
        grand[1] += baseline
        count = sum(1 for e in entries.values() if e.tenant == tenant)
        saved = baseline - cost
        share = f" ({saved / baseline:.0%})" if baseline else ""
        summary.add_row(tenant, str(count), _money(cost), _money(baseline), _money(saved) + share)
    summary.add_row(
        "all", str(len(entries)), _money(grand[0]), _money(grand[1]), _money(grand[1] - grand[0])
    )
    console.print(summary)


def demo(
    config: Annotated[Path, typer.Option("--config", "-c", exists=True, help="YAML config")] = Path(
        "deploy/config.example.yaml"
    ),
) -> None:
    """Start simulators, Redis and the gateway; send mixed traffic; print the cost table; stop.
    Exits non-zero when its ports are taken, its stack does not start, a request fails or a
    request's ledger row is missing."""
    probe = Console()
    console = probe if probe.is_terminal else Console(width=170)
    run_dir = Path("var") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    database_url = f"sqlite+aiosqlite:///{run_dir / 'ledger.db'}"
    settings = load_settings(config, database={"url": database_url})
    busy = taken(stack_endpoints(settings))
    if busy:  # never talk to a stranger's stack
        console.print(f"[red]{escape(ports_taken_message(busy))}[/]")
        raise typer.Exit(1)
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "TIERGATE_DATABASE__URL": database_url,
        "TIERGATE_REDIS__EMBEDDED_DIR": str(run_dir / "redis"),  # a fresh Redis per run
    }
    base = f"http://{settings.server.host}:{settings.server.port}"
    console.print(
        f"[bold]starting[/] simulators, Redis and the gateway ({base}); logs in {run_dir}/"
    )
    stack_log = run_dir / "stack.log"
    with stack_log.open("wb") as log:
        stack = subprocess.Popen(  # noqa: S603
            [sys.executable, "-m", "gateway.cli", "up", "--config", str(config)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            problem = _wait_own_stack(stack, stack_log, base, 90)
            if problem is not None:
                console.print(f"[red]{escape(problem)}[/]")
                raise typer.Exit(1)
            console.print(f"sending {len(DEMO_TRAFFIC)} requests from 3 tenants …")
            results = asyncio.run(_traffic(settings, f"{base}/v1"))
            entries = asyncio.run(_entries(database_url, results))
            _print(console, results, entries)
        finally:
            stack.send_signal(signal.SIGTERM)
            try:
                stack.wait(timeout=15)
            except subprocess.TimeoutExpired:
                stack.kill()
                stack.wait()
            console.print("stopped everything the demo started.")
    incomplete = _incomplete(results, entries.keys())
    if incomplete:
        console.print(f"[red]{escape(incomplete)}[/]")
        raise typer.Exit(1)


def _wait_own_stack(
    stack: subprocess.Popen[bytes], stack_log: Path, base: str, timeout_s: float
) -> str | None:
    """Wait until the stack this demo started serves ``base``: its own log says it listens
    there (logged only once its ports are bound) and ``/readyz`` answers; what went wrong
    otherwise."""
    listening = f"tiergate listening on {base} "
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = stack.poll()
        if code is not None:
            tail = "\n".join(stack_log.read_text(errors="replace").splitlines()[-5:])
            return (
                f"the stack exited with code {code} before it was ready; see {stack_log}:\n{tail}"
            )
        if listening in stack_log.read_text(errors="replace") and wait_http_ok(f"{base}/readyz", 1):
            return None
        time.sleep(0.2)
    return f"the stack did not become ready in {timeout_s:g} s; see {stack_log}"


def _incomplete(results: list[_Result], booked: Container[str]) -> str | None:
    """What the run lacks: failed requests, ledger rows that did not appear (``booked``: the
    request ids whose row was found)."""
    failed = [r for r in results if r.error]
    missing = [r for r in results if not r.error and r.request_id not in booked]
    if not results or failed or missing:
        return (
            f"demo incomplete: {len(failed)} of {len(results)} requests failed, "
            f"{len(missing)} ledger rows missing"
        )
    return None
