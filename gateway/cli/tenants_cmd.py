"""``tiergate tenants create|list|show|update|delete``: run-time tenants, straight in SQL (the
running gateways are told through Redis and reload within a second)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from gateway.auth.admin import AuthAdmin, open_auth_admin
from gateway.auth.tenants import TenantProfile, TenantRecord
from gateway.errors import GatewayError
from gateway.settings import load_settings

__all__ = ["run_admin", "tenants_app"]

tenants_app = typer.Typer(no_args_is_help=True, help="Manage run-time tenants.")

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", exists=True, help="YAML config")]
T = TypeVar("T")


def run_admin(config: Path, action: Callable[[AuthAdmin], Awaitable[T]]) -> T:
    """Run one change against the configured database (and Redis); errors exit 1."""
    settings = load_settings(config)

    async def run() -> T:
        async with open_auth_admin(settings) as admin:
            return await action(admin)

    try:
        return asyncio.run(run())
    except GatewayError as exc:
        typer.echo(f"tiergate: {exc.message}", err=True)
        raise typer.Exit(1) from None


def _view(record: TenantRecord) -> dict[str, Any]:
    return {"name": record.name, **record.profile.model_dump(mode="json")}


def _echo(data: object) -> None:
    typer.echo(json.dumps(data, indent=2))


def _changes(
    default_tier: str | None,
    allowed_tiers: str | None,
    allowed_models: str | None,
    threshold: float | None,
    priority: str | None,
    budget_usd: str | None,
) -> dict[str, Any]:
    def split(value: str) -> list[str]:
        return [v.strip() for v in value.split(",") if v.strip()]

    raw: dict[str, Any] = {
        "default_tier": default_tier,
        "allowed_tiers": split(allowed_tiers) if allowed_tiers is not None else None,
        "allowed_models": split(allowed_models) if allowed_models is not None else None,
        "threshold": threshold,
        "priority": priority,
        "monthly_budget_usd": budget_usd,
    }
    return {k: v for k, v in raw.items() if v is not None}


DefaultTier = Annotated[str | None, typer.Option(help="small | large | external")]
AllowedTiers = Annotated[str | None, typer.Option(help="comma-separated tiers")]
AllowedModels = Annotated[str | None, typer.Option(help="comma-separated deployment ids")]
Threshold = Annotated[float | None, typer.Option(help="classifier threshold for auto, 0-1")]
Priority = Annotated[str | None, typer.Option(help="interactive | standard | batch")]
Budget = Annotated[str | None, typer.Option(help="monthly hard budget in USD")]


def _profile(changes: dict[str, Any]) -> TenantProfile:
    try:
        return TenantProfile.model_validate(changes)
    except ValueError as exc:
        typer.echo(f"tiergate: invalid tenant settings: {exc}", err=True)
        raise typer.Exit(2) from None


@tenants_app.command("create")
def create(
    config: ConfigOpt,
    name: Annotated[str, typer.Argument(help="tenant name")],
    default_tier: DefaultTier = None,
    allowed_tiers: AllowedTiers = None,
    allowed_models: AllowedModels = None,
    threshold: Threshold = None,
    priority: Priority = None,
    budget_usd: Budget = None,
) -> None:
    """Create a tenant (then issue it a key with `tiergate keys create`)."""
    changes = _changes(default_tier, allowed_tiers, allowed_models, threshold, priority, budget_usd)
    profile = _profile(changes)
    if name in load_settings(config).tenants:
        typer.echo(f"tiergate: tenant {name!r} is defined in the config file", err=True)
        raise typer.Exit(1)
    _echo(_view(run_admin(config, lambda a: a.create_tenant(name, profile))))


@tenants_app.command("update")
def update(
    config: ConfigOpt,
    name: Annotated[str, typer.Argument(help="tenant name")],
    default_tier: DefaultTier = None,
    allowed_tiers: AllowedTiers = None,
    allowed_models: AllowedModels = None,
    threshold: Threshold = None,
    priority: Priority = None,
    budget_usd: Budget = None,
) -> None:
    """Change some of a tenant's settings."""
    changes = _changes(default_tier, allowed_tiers, allowed_models, threshold, priority, budget_usd)
    _profile(changes)
    _echo(_view(run_admin(config, lambda a: a.update_tenant(name, changes))))


@tenants_app.command("list")
def list_(config: ConfigOpt) -> None:
    """Run-time tenants (config-file tenants are in the config)."""
    _echo([_view(r) for r in run_admin(config, lambda a: a.store.list_tenants())])


@tenants_app.command("show")
def show(config: ConfigOpt, name: Annotated[str, typer.Argument(help="tenant name")]) -> None:
    _echo(_view(run_admin(config, lambda a: a.store.get_tenant(name))))


@tenants_app.command("delete")
def delete(config: ConfigOpt, name: Annotated[str, typer.Argument(help="tenant name")]) -> None:
    """Delete a tenant and revoke every key acting for it."""
    run_admin(config, lambda a: a.delete_tenant(name))
    typer.echo(f"deleted tenant {name}; its keys are revoked")
