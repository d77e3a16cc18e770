"""``tiergate keys create|list|rotate|revoke``: run-time API keys. The plain key is printed once,
at creation or rotation; SQL keeps a salted hash."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Annotated

import typer

from gateway.auth.admin import MAX_KEY_LIFETIME_S
from gateway.auth.store import IssuedKey
from gateway.cli.tenants_cmd import run_admin

__all__ = ["keys_app"]

keys_app = typer.Typer(no_args_is_help=True, help="Issue, list, rotate and revoke API keys.")

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", exists=True, help="YAML config")]


def _show_once(issued: IssuedKey) -> None:
    typer.echo(json.dumps({**issued.record.public(), "key": issued.key}, indent=2))
    typer.echo("The key above is shown once; tiergate keeps only a hash of it.", err=True)


@keys_app.command("create")
def create(
    config: ConfigOpt,
    principal: Annotated[str, typer.Option(help="who the key belongs to (recorded as author)")],
    role: Annotated[
        list[str],
        typer.Option(
            "--role", help="tenant:<name>, rules:<name>, finance, admin (one tenant per key)"
        ),
    ],
    expires_in: Annotated[
        int | None,
        typer.Option(min=1, max=MAX_KEY_LIFETIME_S, help="seconds until it expires (≤ 10 years)"),
    ] = None,
    note: Annotated[str | None, typer.Option(help="free text shown in listings")] = None,
) -> None:
    """Issue a key for a principal."""
    expires = None if expires_in is None else timedelta(seconds=expires_in)
    _show_once(
        run_admin(config, lambda a: a.create_key(principal, role, expires_in=expires, note=note))
    )


@keys_app.command("list")
def list_(
    config: ConfigOpt,
    principal: Annotated[str | None, typer.Option(help="only this principal's keys")] = None,
) -> None:
    """Key ids, principals, roles and times (never the keys)."""
    records = run_admin(config, lambda a: a.store.list_keys(principal=principal), change=False)
    typer.echo(json.dumps([r.public() for r in records], indent=2))


@keys_app.command("rotate")
def rotate(
    config: ConfigOpt,
    key_id: Annotated[str, typer.Argument(help="the key to replace")],
    overlap: Annotated[int, typer.Option(help="seconds the old key keeps working")] = 3600,
) -> None:
    """Issue a replacement key; the old one stops working when the overlap window closes."""
    _show_once(
        run_admin(config, lambda a: a.rotate_key(key_id, overlap=timedelta(seconds=overlap)))
    )


@keys_app.command("revoke")
def revoke(config: ConfigOpt, key_id: Annotated[str, typer.Argument(help="key id")]) -> None:
    """Refuse a key from now on, on every gateway process."""
    record = run_admin(config, lambda a: a.revoke_key(key_id))
    typer.echo(json.dumps(record.public(), indent=2))
