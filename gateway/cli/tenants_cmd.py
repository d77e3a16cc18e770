"""``tiergate tenants create|list|show|update|delete``: run-time tenants, straight in SQL (the
running gateways are told through Redis and reload within a second: the configured Redis, or
the embedded one a running gateway started on ``redis.embedded_dir``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
import yaml
from pydantic import ValidationError

from gateway.api.tenant_views import config_view
from gateway.auth.admin import AuthAdmin, open_auth_admin
from gateway.auth.tenant_changes import TenantChanges
from gateway.auth.tenants import TenantProfile, TenantRecord
from gateway.embedded_redis import EmbeddedRedis
from gateway.errors import GatewayError, InvalidRequest
from gateway.settings import Settings, load_settings

__all__ = ["run_admin", "tenants_app"]

tenants_app = typer.Typer(no_args_is_help=True, help="Manage run-time tenants.")

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", exists=True, help="YAML config")]
T = TypeVar("T")


def run_admin(
    config: Path, action: Callable[[AuthAdmin], Awaitable[T]], *, change: bool = True
) -> T:
    """Run one action against the configured database (and Redis); errors exit 1. A
    ``change`` is announced to the running gateways on their Redis: the configured one, or the
    embedded one a gateway runs on ``redis.embedded_dir``; with neither, the CLI says when
    running gateways will see it."""
    settings = _with_running_redis(load_settings(config))

    async def run() -> T:
        async with open_auth_admin(settings) as admin:
            return await action(admin)

    try:
        result = asyncio.run(run())
    except GatewayError as exc:
        typer.echo(f"tiergate: {exc.message}", err=True)
        raise typer.Exit(1) from None
    if change and settings.redis.url is None:
        typer.echo(
            f"tiergate: saved; no gateway runs an embedded Redis in "
            f"{settings.redis.embedded_dir} to tell: gateways apply it when they start, or at "
            "their next full reload from the database (within 30 s)",
            err=True,
        )
    return result


def _with_running_redis(settings: Settings) -> Settings:
    """``settings`` with the URL of the embedded Redis a running gateway started, when the
    config names no Redis: the change is then announced there, as the admin API would."""
    if settings.redis.url is not None:
        return settings
    url = EmbeddedRedis.running_url(settings.redis.embedded_dir)
    if url is None:
        return settings
    redis = settings.redis.model_copy(update={"url": url})
    return settings.model_copy(update={"redis": redis})


def _view(record: TenantRecord) -> dict[str, Any]:
    return {"name": record.name, "source": "runtime", **record.profile.model_dump(mode="json")}


def _config_view(settings: Settings, name: str) -> dict[str, Any]:
    """A config-file tenant as the admin API shows it, without ``effective`` (what a running
    process holds it to: ask the admin API)."""
    view = config_view(settings, {}, name)
    view.pop("effective")
    return view


def _echo(data: object) -> None:
    typer.echo(json.dumps(data, indent=2))


def _fail(message: str) -> NoReturn:
    typer.echo(f"tiergate: {message}", err=True)
    raise typer.Exit(2)


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _budget(spec: str) -> dict[str, Any]:
    """One ``--budget``: a YAML flow mapping, as a budget is written in the config file."""
    try:
        value = yaml.safe_load(spec)
    except yaml.YAMLError:
        value = None
    if not isinstance(value, dict):
        example = '{name: monthly, limit_usd: "500"}'
        _fail(f"--budget takes a mapping like '{example}', not {spec!r}")
    return value


def _changes(**options: Any) -> dict[str, Any]:
    """The settings given on the command line, as profile fields (unset options left out)."""
    raw = dict(options)
    for listed in ("allowed_tiers", "allowed_models"):
        if raw[listed] is not None:
            raw[listed] = _split(raw[listed])
    if raw["budgets"] is not None:
        raw["budgets"] = [_budget(spec) for spec in raw["budgets"]]
    raw["monthly_budget_usd"] = raw.pop("budget_usd")
    return {k: v for k, v in raw.items() if v is not None}


DefaultTier = Annotated[str | None, typer.Option(help="small | large | external")]
AllowedTiers = Annotated[str | None, typer.Option(help="comma-separated tiers")]
AllowedModels = Annotated[str | None, typer.Option(help="comma-separated deployment ids")]
Threshold = Annotated[float | None, typer.Option(help="classifier threshold for auto, 0-1")]
Priority = Annotated[str | None, typer.Option(help="interactive | standard | batch")]
Weight = Annotated[float | None, typer.Option(help="fair share within a queue lane (default 1)")]
RequestsPerMinute = Annotated[int | None, typer.Option(help="rate limit (unset: none)")]
TokensPerMinute = Annotated[
    int | None, typer.Option(help="rate limit: prompt estimate + max_tokens (unset: none)")
]
Baseline = Annotated[
    str | None,
    typer.Option(help="deployment pricing the ledger's baseline (default: first large one)"),
]
Budgets = Annotated[
    list[str] | None,
    typer.Option(
        "--budget",
        help='a budget as in the config file, e.g. \'{name: weekly, limit_usd: "50", window: '
        "7d, mode: soft, app: chatbot}'; repeat for more; on update, replaces them all",
    ),
]
Budget = Annotated[
    str | None, typer.Option(help="monthly hard budget in USD (the budget named 'monthly')")
]


CLEARABLE = tuple(TenantChanges.model_fields)
_OPTION_NAMES = {"budget": "budgets", "budget_usd": "monthly_budget_usd"}
"""``--clear`` also takes the name of the option that sets a setting (``--budget-usd``)."""
Clear = Annotated[
    list[str] | None,
    typer.Option(
        "--clear",
        metavar="SETTING",
        help="put a setting back to its default, as a PATCH with null does: "
        f"{', '.join(CLEARABLE)} (dashes or underscores); repeat for more",
    ),
]


def _cleared(names: list[str], changes: dict[str, Any]) -> dict[str, Any]:
    """``changes`` with each ``--clear`` setting set to ``None`` (back to its default)."""
    cleared = dict(changes)
    for given in names:
        field = given.strip().replace("-", "_")
        field = _OPTION_NAMES.get(field, field)
        if field not in CLEARABLE:
            _fail(f"--clear: unknown setting {given!r}; one of {', '.join(CLEARABLE)}")
        if cleared.get(field) is not None:
            _fail(f"{field} is both set and cleared")
        cleared[field] = None
    return cleared


def _profile(changes: dict[str, Any]) -> TenantProfile:
    try:
        return TenantProfile.model_validate(changes)
    except ValueError as exc:
        _fail(f"invalid tenant settings: {exc}")


def _check_models(settings: Settings, profile: TenantProfile) -> None:
    wrong = profile.unknown_deployment(d.model for d in settings.deployments)
    if wrong is not None:
        _fail(f"{wrong[0]}: {wrong[1]}")


@tenants_app.command("create")
def create(
    config: ConfigOpt,
    name: Annotated[str, typer.Argument(help="tenant name")],
    default_tier: DefaultTier = None,
    allowed_tiers: AllowedTiers = None,
    allowed_models: AllowedModels = None,
    threshold: Threshold = None,
    priority: Priority = None,
    weight: Weight = None,
    requests_per_minute: RequestsPerMinute = None,
    tokens_per_minute: TokensPerMinute = None,
    baseline_model: Baseline = None,
    budgets: Budgets = None,
    budget_usd: Budget = None,
) -> None:
    """Create a tenant (then issue it a key with `tiergate keys create`)."""
    changes = _changes(
        default_tier=default_tier,
        allowed_tiers=allowed_tiers,
        allowed_models=allowed_models,
        threshold=threshold,
        priority=priority,
        weight=weight,
        requests_per_minute=requests_per_minute,
        tokens_per_minute=tokens_per_minute,
        baseline_model=baseline_model,
        budgets=budgets,
        budget_usd=budget_usd,
    )
    profile = _profile(changes)
    settings = load_settings(config)
    _check_models(settings, profile)
    if name in settings.tenants:
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
    weight: Weight = None,
    requests_per_minute: RequestsPerMinute = None,
    tokens_per_minute: TokensPerMinute = None,
    baseline_model: Baseline = None,
    budgets: Budgets = None,
    budget_usd: Budget = None,
    clear: Clear = None,
) -> None:
    """Change some of a tenant's settings; `--clear` puts one back to its default."""
    given = _changes(
        default_tier=default_tier,
        allowed_tiers=allowed_tiers,
        allowed_models=allowed_models,
        threshold=threshold,
        priority=priority,
        weight=weight,
        requests_per_minute=requests_per_minute,
        tokens_per_minute=tokens_per_minute,
        baseline_model=baseline_model,
        budgets=budgets,
        budget_usd=budget_usd,
    )
    changes = _checked(config, _cleared(clear or [], given))
    _echo(_view(run_admin(config, lambda a: a.update_tenant(name, changes))))


def _checked(config: Path, changes: dict[str, Any]) -> dict[str, Any]:
    """``changes`` checked as a PATCH body is (``TenantChanges``), then applied to a tenant with
    nothing set, for their values and the deployments they name (what depends on the tenant's
    own settings is the store's to check)."""
    try:
        given = TenantChanges.model_validate(changes).given()
        profile = TenantProfile().merged(given)
    except ValidationError as exc:
        first = exc.errors()[0]
        _fail(f"invalid tenant settings: {'.'.join(str(p) for p in first['loc'])}: {first['msg']}")
    except InvalidRequest as exc:
        _fail(exc.message)
    _check_models(load_settings(config), profile)
    return given


@tenants_app.command("list")
def list_(config: ConfigOpt) -> None:
    """Every tenant: the config file's (``source: config``), then the run-time ones
    (``source: runtime``; one named like a config-file tenant is shadowed by it)."""
    settings = load_settings(config)
    records = run_admin(config, lambda a: a.store.list_tenants(), change=False)
    _echo(
        [_config_view(settings, name) for name in settings.tenants]
        + [{**_view(r), **_shadowed(settings, r.name)} for r in records]
    )


@tenants_app.command("show")
def show(config: ConfigOpt, name: Annotated[str, typer.Argument(help="tenant name")]) -> None:
    """A tenant's settings; a config-file tenant's from the config (it wins over a run-time
    tenant of its name)."""
    settings = load_settings(config)
    if name in settings.tenants:
        _echo(_config_view(settings, name))
        return
    _echo(_view(run_admin(config, lambda a: a.store.get_tenant(name), change=False)))


def _shadowed(settings: Settings, name: str) -> dict[str, Any]:
    return {"shadowed_by_config": True} if name in settings.tenants else {}


@tenants_app.command("delete")
def delete(config: ConfigOpt, name: Annotated[str, typer.Argument(help="tenant name")]) -> None:
    """Delete a tenant and revoke every key acting for it."""
    run_admin(config, lambda a: a.delete_tenant(name))
    typer.echo(f"deleted tenant {name}; its keys are revoked")
