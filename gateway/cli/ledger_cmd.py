"""``tiergate report`` and ``tiergate ledger show | verify | rollup``: the ledger from the command
line."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal

import redis.asyncio as aioredis
import typer
from rich.console import Console

from gateway.accounting.events import row_values
from gateway.accounting.gpu_rates import GpuRates
from gateway.accounting.ledger import SqlLedger
from gateway.accounting.prices import PriceBook
from gateway.accounting.reports import (
    cost_report,
    display_usd,
    render_csv,
    render_json,
    render_table,
)
from gateway.accounting.rollups import replica_time, rollup_day
from gateway.accounting.verify import VerifyReport, verify_ledger
from gateway.accounting.whatif import render_what_if, what_if
from gateway.queue.client.connection import configured_client
from gateway.queue.keys import RedisKeys
from gateway.settings import Settings, load_settings

__all__ = ["ledger_app", "report"]

ledger_app = typer.Typer(no_args_is_help=True, help="Ledger rows, rollups and reconciliation.")

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", exists=True, help="YAML config")]


def report(
    config: ConfigOpt,
    tenant: Annotated[str | None, typer.Option(help="tenant (all tenants when omitted)")] = None,
    format: Annotated[
        Literal["auto", "table", "csv", "tsv", "json"],
        typer.Option(help="output format; auto: a table on a terminal, else TSV (full values)"),
    ] = "auto",
    since: Annotated[str | None, typer.Option("--from", help="first day, YYYY-MM-DD")] = None,
    until: Annotated[str | None, typer.Option("--to", help="last day, YYYY-MM-DD")] = None,
    group_by: Annotated[
        str, typer.Option(help="comma-separated: day,model,tier,tag,rule,tenant,app,outcome")
    ] = "day,model",
    whatif: Annotated[
        bool, typer.Option("--what-if", help="price the period as routed, external, self-hosted")
    ] = False,
) -> None:
    """Cost per tenant, summed by day and model (or other groups)."""
    settings = load_settings(config)
    if format == "auto":
        format = "table" if sys.stdout.isatty() else "tsv"

    async def run() -> None:
        ledger = await SqlLedger.connect(settings.database.url)
        if whatif:
            try:
                scenarios = await what_if(
                    ledger,
                    PriceBook.from_settings(settings.deployments),
                    settings.deployments,
                    tenant=tenant,
                    start=_day(since),
                    end=_day(until),
                )
            finally:
                await ledger.aclose()
            _print_what_if(render_what_if(scenarios), format)
            return
        try:
            result = await cost_report(
                ledger,
                tenant=tenant,
                start=date.fromisoformat(since) if since else None,
                end=date.fromisoformat(until) if until else None,
                group_by=tuple(g.strip() for g in group_by.split(",") if g.strip()),
            )
        finally:
            await ledger.aclose()
        if format == "json":
            typer.echo(json.dumps(render_json(result), indent=2))
        elif format in ("csv", "tsv"):
            typer.echo(render_csv(result, delimiter="," if format == "csv" else "\t"), nl=False)
        else:
            console = Console()
            console.print(render_table(result, width=console.width))

    asyncio.run(run())


@ledger_app.command("show")
def show(
    config: ConfigOpt,
    request_id: Annotated[str, typer.Option(help="the request's x-request-id")],
) -> None:
    """One ledger row, as JSON: every column, defaults included."""
    settings = load_settings(config)

    async def run() -> None:
        ledger = await SqlLedger.connect(settings.database.url)
        try:
            entry = await ledger.get(request_id)
        finally:
            await ledger.aclose()
        if entry is None:
            typer.echo(f"no ledger row for {request_id}", err=True)
            raise typer.Exit(1)
        typer.echo(json.dumps(row_values(entry), indent=2))

    asyncio.run(run())


def _print_what_if(data: dict[str, Any], format: str) -> None:
    if format == "json":
        typer.echo(json.dumps(data, indent=2))
        return
    rows = [
        (s["name"], s["model"] or "", s["cost_usd"] or "unknown", s["rate_source"], s["includes"])
        for s in data["scenarios"]
    ]
    if format in ("csv", "tsv"):
        sep = "," if format == "csv" else "\t"
        out = io.StringIO()
        writer = csv.writer(out, delimiter=sep, lineterminator="\n")
        writer.writerow(("scenario", "model", "cost_usd", "rate_source", "includes"))
        writer.writerows(rows)
        typer.echo(out.getvalue(), nl=False)
        return
    from rich.table import Table

    table = Table(
        title=f"What-if — {data['tenant'] or 'all tenants'}, "
        f"{data['prompt_tokens']:,} + {data['completion_tokens']:,} tokens"
    )
    for header in ("scenario", "model", "cost", "rate", "includes"):
        table.add_column(header)
    for name, model, cost, source, includes in rows:
        shown = cost if cost == "unknown" else display_usd(Decimal(cost))
        table.add_row(name, model, shown, source, includes)
    Console().print(table)


def _day(text: str | None) -> date | None:
    return date.fromisoformat(text) if text else None


@asynccontextmanager
async def _ledger_and_redis(
    settings: Settings,
) -> AsyncIterator[tuple[SqlLedger, aioredis.Redis | None]]:
    """The ledger, and Redis when the config names one (``None`` otherwise); both closed on
    the way out."""
    ledger = await SqlLedger.connect(settings.database.url)
    redis = configured_client(settings.redis, socket_timeout=5.0) if settings.redis.url else None
    try:
        yield ledger, redis
    finally:
        await ledger.aclose()
        if redis is not None:
            await redis.aclose()


def gpu_pool_costs(settings: Settings) -> dict[str, Decimal]:
    """Pool $/h of every GPU-priced deployment."""
    prices = PriceBook.from_settings(settings.deployments, cost_map={})
    costs = {m: prices.gpu_cost(m) for m in prices.gpu_models}
    return {m: c.hourly_usd for m, c in costs.items() if c is not None}


@ledger_app.command("rollup")
def rollup(
    config: ConfigOpt,
    day: Annotated[str | None, typer.Option(help="UTC day, YYYY-MM-DD (default: today)")] = None,
) -> None:
    """Recompute one day's rollups and GPU true-up from the ledger rows."""
    settings = load_settings(config)

    async def run() -> None:
        async with _ledger_and_redis(settings) as (ledger, redis):
            target = _day(day) or datetime.now(UTC).date()
            running = {}  # the replica time the gateway recorded that day (Redis)
            if redis is not None:
                prices = PriceBook.from_settings(settings.deployments, cost_map={})
                rates = GpuRates(redis, settings.redis.key_prefix, prices.gpu_pools)
                running = await replica_time(rates, target)
            result = await rollup_day(ledger, target, gpu=gpu_pool_costs(settings), running=running)
        typer.echo(
            f"{result.day}: {result.groups} rollup groups, {result.trueup_rows} true-up rows"
        )

    asyncio.run(run())


def _print_verify(report: VerifyReport) -> None:
    typer.echo(
        f"rows {report.rows}, days {report.days}, rollup groups {report.rollup_groups}, "
        f"stream events {report.stream_events} ({report.stream_booked} booked, "
        f"{report.stream_in_flight} in flight), dead letters {report.dead_letters}"
    )
    for note in report.notes:
        typer.echo(f"note: {note}")
    for diff in report.differences:
        typer.echo(f"DIFFERENCE [{diff.check}] {diff.detail}")
    typer.echo(
        "ok: rows, rollups, true-up and stream agree; no dead letters"
        if report.ok
        else f"{len(report.differences)} differences"
    )


@ledger_app.command("verify")
def verify(
    config: ConfigOpt,
    since: Annotated[str | None, typer.Option("--from", help="first day, YYYY-MM-DD")] = None,
    until: Annotated[str | None, typer.Option("--to", help="last day, YYYY-MM-DD")] = None,
) -> None:
    """Reconcile ledger rows, daily rollups, GPU true-ups and the event stream; print every
    difference (exit status 1 when there is one)."""
    settings = load_settings(config)

    async def run() -> VerifyReport:
        async with _ledger_and_redis(settings) as (ledger, redis):
            return await verify_ledger(
                ledger,
                start=_day(since),
                end=_day(until),
                redis=redis,
                stream=RedisKeys(settings.redis.key_prefix).ledger_events,
            )

    report = asyncio.run(run())
    if settings.redis.url is None:
        report.notes.append("no redis.url configured: the event stream was not checked")
    _print_verify(report)
    if not report.ok:
        raise typer.Exit(1)
