"""``tiergate``: serve, work, simulate, run everything locally, and read the ledger."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from gateway.auth.keys import MissingKeys
from gateway.cli import (
    classify_cmd,
    demo_cmd,
    keys_cmd,
    ledger_cmd,
    rules_cmd,
    tenants_cmd,
    train_cmd,
    up_cmd,
)
from gateway.settings import Settings, load_settings

__all__ = ["app", "main"]

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
app.add_typer(ledger_cmd.ledger_app, name="ledger")
app.add_typer(rules_cmd.rules_app, name="rules")
app.add_typer(tenants_cmd.tenants_app, name="tenants")
app.add_typer(keys_cmd.keys_app, name="keys")
app.command("report")(ledger_cmd.report)
app.command("up")(up_cmd.up)
app.command("demo")(demo_cmd.demo)
app.command("train")(train_cmd.train)
app.command("classify")(classify_cmd.classify)
app.command("eval")(classify_cmd.evaluate)

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="YAML config file", exists=True)]


def configure_logging(level: int = logging.INFO, settings: Settings | None = None) -> None:
    """Text logs until the config is read; then the config's ``logging`` (JSON by default)."""
    from gateway.observability.logging import configure_logging as configure

    if settings is None:
        configure(level, fmt="text")
        return
    configure(settings.logging.level.upper(), fmt=settings.logging.format)


def _load(config: Path, **overrides: object) -> Settings:
    try:
        return load_settings(config, **overrides)
    except ValueError as exc:
        typer.echo(f"invalid config {config}: {exc}", err=True)
        raise typer.Exit(2) from None


def _run_async(coro: object) -> None:
    import uvloop

    try:
        uvloop.run(coro)  # type: ignore[arg-type]
    except MissingKeys as exc:
        typer.echo(f"tiergate: {exc}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        pass


@app.command()
def serve(
    config: ConfigOpt,
    host: Annotated[str | None, typer.Option(help="public host")] = None,
    port: Annotated[int | None, typer.Option(help="public port")] = None,
    no_workers: Annotated[bool, typer.Option("--no-workers", help="run the edge only")] = False,
    dev: Annotated[bool, typer.Option("--dev", help="allow documented development keys")] = False,
) -> None:
    """Run the gateway: edge, workers and ledger sink in one process."""
    from gateway.server import serve as run_serve

    configure_logging()
    settings = _load(config)
    configure_logging(settings=settings)
    server = settings.server.model_copy(
        update={k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    )
    settings = settings.model_copy(update={"server": server})
    _run_async(run_serve(settings, dev=dev, workers=not no_workers))


@app.command()
def worker(
    config: ConfigOpt,
    no_sink: Annotated[
        bool, typer.Option("--no-sink", help="workers only; run the sink with `tiergate sink`")
    ] = False,
    dev: Annotated[bool, typer.Option("--dev", help="allow documented development keys")] = False,
) -> None:
    """Run workers and the ledger sink, without the edge (metrics and health on the admin
    port)."""
    from gateway.server import serve_worker

    configure_logging()
    settings = _load(config)
    configure_logging(settings=settings)
    _run_async(serve_worker(settings, dev=dev, sink=not no_sink))


@app.command()
def sink(
    config: ConfigOpt,
    dev: Annotated[bool, typer.Option("--dev", help="allow documented development keys")] = False,
) -> None:
    """Run the ledger sink (event stream → SQL) and the daily rollups alone (metrics and health
    on the admin port)."""
    from gateway.server import serve_worker

    configure_logging()
    settings = _load(config)
    configure_logging(settings=settings)
    _run_async(serve_worker(settings, dev=dev, workers=False))


@app.command()
def sim(
    profile: Annotated[str, typer.Option(help="simulator profile (served model id)")],
    port: Annotated[int, typer.Option(help="port to listen on")],
    host: Annotated[str, typer.Option(help="host to bind")] = "127.0.0.1",
    time_scale: Annotated[float, typer.Option(help="latency multiplier; 0 answers at once")] = 1.0,
    usage_log: Annotated[Path | None, typer.Option(help="JSONL file, a line per request")] = None,
    ttft_ms: Annotated[
        float | None, typer.Option(help="fixed time to first token, wall-clock ms", min=0)
    ] = None,
    itl_ms: Annotated[
        float | None, typer.Option(help="fixed inter-token latency, wall-clock ms", min=0)
    ] = None,
    max_num_seqs: Annotated[
        int | None, typer.Option(help="batch size (default: the profile's)", min=1)
    ] = None,
    enable_prefix_caching: Annotated[
        bool | None,
        typer.Option(
            "--enable-prefix-caching/--no-enable-prefix-caching",
            help="automatic prefix caching, as vLLM's flag (default: the profile's, on)",
        ),
    ] = None,
) -> None:
    """Run a vLLM-compatible simulator. --ttft-ms / --itl-ms replace the latency model with fixed
    wall-clock latencies (not scaled by --time-scale, no load slowdown). Prompt tokens found in
    the prefix cache need no prefill (vLLM's automatic prefix caching; off with
    --no-enable-prefix-caching)."""
    from backends.sim import PROFILES, run_sim

    if profile not in PROFILES:
        typer.echo(f"unknown profile {profile!r}; known: {', '.join(sorted(PROFILES))}", err=True)
        raise typer.Exit(2)
    configure_logging(logging.WARNING)
    run_sim(
        profile,
        host=host,
        port=port,
        time_scale=time_scale,
        usage_log=usage_log,
        ttft_ms=ttft_ms,
        itl_ms=itl_ms,
        max_num_seqs=max_num_seqs,
        enable_prefix_caching=enable_prefix_caching,
    )


def main() -> None:
    app()
