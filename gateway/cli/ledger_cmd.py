"""``tiergate report`` and ``tiergate ledger show``: read the ledger from the command line."""

from __future__ import annotations

import asyncio
import json
from datetime import date
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.console import Console

from gateway.accounting.events import encode_entry
from gateway.accounting.ledger import SqlLedger
from gateway.accounting.reports import cost_report, render_csv, render_json, render_table
from gateway.settings import load_settings

__all__ = ["ledger_app", "report"]

ledger_app = typer.Typer(no_args_is_help=True, help="Read single ledger rows.")

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", exists=True, help="YAML config")]


def report(
    config: ConfigOpt,
    tenant: Annotated[str | None, typer.Option(help="tenant (all tenants when omitted)")] = None,
    format: Annotated[
        Literal["table", "csv", "json"], typer.Option(help="output format")
    ] = "table",
    since: Annotated[str | None, typer.Option("--from", help="first day, YYYY-MM-DD")] = None,
    until: Annotated[str | None, typer.Option("--to", help="last day, YYYY-MM-DD")] = None,
    group_by: Annotated[
        str, typer.Option(help="comma-separated: day,model,tier,tenant")
    ] = "day,model",
) -> None:
    """Cost per tenant, summed by day and model (or other groups)."""
    settings = load_settings(config)

    async def run() -> None:
        ledger = await SqlLedger.connect(settings.database.url)
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
        elif format == "csv":
            typer.echo(render_csv(result), nl=False)
        else:
            Console().print(render_table(result))

    asyncio.run(run())


@ledger_app.command("show")
def show(
    config: ConfigOpt,
    request_id: Annotated[str, typer.Option(help="the request's x-request-id")],
) -> None:
    """One ledger row, as JSON."""
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
        typer.echo(json.dumps(json.loads(encode_entry(entry)), indent=2))

    asyncio.run(run())
