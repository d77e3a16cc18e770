"""``tiergate rules``: validate, apply, explain, history and roll back routing rules.

``validate`` and ``explain --rules FILE`` work on files alone (try before shipping); ``apply``,
``history``, ``rollback`` and ``explain`` without a file use the SQL store of ``--config``
(running gateways pick a change up within their poll interval, at once when Redis is
reachable).
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from gateway.rules.setup import changes_channel
from gateway.rules.store import GLOBAL, RuleVersion, SqlRuleStore
from gateway.settings import Settings, load_settings
from router.catalog import Tier
from router.rules import RequestContext, RuleSet, RulesInvalid, parse_rules

__all__ = ["rules_app"]

rules_app = typer.Typer(no_args_is_help=True, help="Routing rules: validate, apply, explain.")

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", exists=True, help="YAML config")]
TenantOpt = Annotated[str, typer.Option("--tenant", "-t", help=f"tenant (or {GLOBAL})")]
FileArg = Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="rule file")]


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(code)


def _catalog(settings: Settings | None) -> Any:
    if settings is None:
        return None
    from gateway.services import build_catalog

    return build_catalog(settings)


def _known_tenant(settings: Settings, tenant: str) -> None:
    if tenant != GLOBAL and tenant not in settings.tenants:
        raise _fail(f"unknown tenant {tenant!r} (not in the config)", 2)


@rules_app.command("validate")
def validate(
    file: FileArg,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", exists=True, help="check deployment names")
    ] = None,
) -> None:
    """Check a rule file; on an error print it with its line and exit 1."""
    settings = load_settings(config) if config else None
    try:
        rules = parse_rules(_read(file), catalog=_catalog(settings))
    except RulesInvalid as exc:
        raise _fail(f"{file}: {exc}") from None
    typer.echo(f"{file}: ok, {len(rules.rules)} rules ({', '.join(r.id for r in rules.rules)})")


async def _announce(settings: Settings, version: RuleVersion) -> None:
    if settings.redis.url is None:
        return
    from redis.exceptions import RedisError

    from gateway.queue.client.connection import configured_client

    redis = configured_client(settings.redis)
    try:
        await redis.publish(
            changes_channel(settings.redis.key_prefix), f"{version.tenant}:{version.version}"
        )
    except (RedisError, OSError):
        pass  # the gateways' version check finds the change anyway
    finally:
        await redis.aclose()


async def _with_store(settings: Settings, work: Any) -> Any:
    store = await SqlRuleStore.connect(settings.database.url)
    try:
        return await work(store)
    finally:
        await store.aclose()


def _print_version(version: RuleVersion) -> None:
    typer.echo(
        f"{version.tenant} v{version.version} by {version.author} at "
        f"{version.created_at.isoformat()} ({version.action})"
    )


@rules_app.command("apply")
def apply(
    file: FileArg,
    tenant: TenantOpt,
    config: ConfigOpt,
    author: Annotated[str, typer.Option(help="recorded as the change's author")] = "cli",
) -> None:
    """Validate FILE and store it as the tenant's next rules version."""
    settings = load_settings(config)
    _known_tenant(settings, tenant)
    source = _read(file)
    try:
        parse_rules(source, catalog=_catalog(settings))
    except RulesInvalid as exc:
        raise _fail(f"{file}: {exc}") from None

    async def work(store: SqlRuleStore) -> RuleVersion:
        current = await store.current(tenant)
        if current is not None and current.source == source:
            return current
        version = await store.append(tenant, source, author=author, action="put")
        await _announce(settings, version)
        return version

    _print_version(asyncio.run(_with_store(settings, work)))


@rules_app.command("history")
def history(tenant: TenantOpt, config: ConfigOpt, diff: bool = False) -> None:
    """Every version of the tenant's rules: number, author, time, action (and diff)."""
    settings = load_settings(config)
    versions: list[RuleVersion] = asyncio.run(
        _with_store(settings, lambda store: store.history(tenant))
    )
    if not versions:
        typer.echo(f"{tenant}: no rules versions")
    for version in versions:
        restored = f" of v{version.restored}" if version.restored else ""
        typer.echo(
            f"v{version.version}\t{version.created_at.isoformat()}\t{version.author}\t"
            f"{version.action}{restored}"
        )
        if diff and version.diff:
            typer.echo(version.diff.rstrip("\n"))


@rules_app.command("rollback")
def rollback(
    tenant: TenantOpt,
    config: ConfigOpt,
    to: Annotated[int, typer.Option("--to", help="version to restore")],
    author: Annotated[str, typer.Option(help="recorded as the change's author")] = "cli",
) -> None:
    """Restore version N exactly (as a new version)."""
    settings = load_settings(config)
    _known_tenant(settings, tenant)

    async def work(store: SqlRuleStore) -> RuleVersion | None:
        old = await store.get(tenant, to)
        if old is None:
            return None
        version = await store.append(
            tenant, old.source, author=author, action="rollback", restored=to
        )
        await _announce(settings, version)
        return version

    version = asyncio.run(_with_store(settings, work))
    if version is None:
        raise _fail(f"{tenant} has no rules version {to}")
    _print_version(version)


async def _stored_rules(settings: Settings, tenant: str) -> RuleSet:
    async def work(store: SqlRuleStore) -> RuleSet:
        own, shared = await store.current(tenant), await store.current(GLOBAL)
        mine = parse_rules(own.source) if own and own.source else RuleSet()
        common = parse_rules(shared.source) if shared and shared.source else RuleSet()
        return mine.then(common.scoped("global"))

    result: RuleSet = await _with_store(settings, work)
    return result


@rules_app.command("explain")
def explain(
    tenant: TenantOpt,
    config: ConfigOpt,
    prompt: Annotated[str, typer.Option(help="the user message")],
    rules: Annotated[
        Path | None, typer.Option("--rules", exists=True, help="try this file, not the store")
    ] = None,
    model: Annotated[str, typer.Option(help="requested model")] = "auto",
    app: Annotated[str | None, typer.Option(help="x-tiergate-app")] = None,
    tags: Annotated[str, typer.Option(help="x-tiergate-tags, comma-separated")] = "",
    max_tokens: Annotated[int | None, typer.Option(help="the request's max_tokens")] = None,
    timeout_ms: Annotated[
        int | None, typer.Option(help="x-tiergate-timeout-ms (default: the config's)")
    ] = None,
    wait: Annotated[
        list[str] | None,
        typer.Option(help="a tier's expected queue wait, TIER=SECONDS (repeatable)"),
    ] = None,
) -> None:
    """The route plan for a prompt (no model is called), as JSON. There are no live signals:
    queue waits are those given with ``--wait`` (none: 0), typical job times unknown."""
    from gateway.services import _FALLBACK_THRESHOLD, build_policies
    from router.features import PromptFeatures
    from router.loader import load_serving_classifier
    from router.planner import decide

    settings = load_settings(config)
    if tenant not in settings.tenants:
        raise _fail(f"unknown tenant {tenant!r} (not in the config)", 2)
    try:
        ruleset = (
            parse_rules(_read(rules), catalog=_catalog(settings))
            if rules
            else asyncio.run(_stored_rules(settings, tenant))
        )
    except RulesInvalid as exc:
        raise _fail(f"{rules}: {exc}") from None
    classifier = load_serving_classifier(settings.router.model_path)
    policies = build_policies(settings, classifier.threshold or _FALLBACK_THRESHOLD)
    from gateway.api.meta import RequestMeta
    from gateway.api.timeout import request_timeout_ms
    from router.catalog import Signals
    from router.errors import RoutingError

    timeout = request_timeout_ms(
        RequestMeta(timeout_ms=timeout_ms), settings.queue, headers={}, stream=False
    )
    try:
        plan = decide(
            requested_model=model,
            features=PromptFeatures.from_text(prompt),
            max_tokens=max_tokens or settings.limits.default_max_tokens,
            policy=policies[tenant],
            catalog=_catalog(settings),
            signals=Signals(expected_wait_s=_waits(wait or [])),
            classifier=classifier,
            rules=ruleset,
            context=RequestContext(
                app=app,
                tags=tuple(t.strip() for t in tags.split(",") if t.strip()),
                now=datetime.now(UTC),
                time_left_s=timeout / 1000,
            ),
        )
    except RoutingError as exc:
        raise _fail(f"refused: {exc.message}") from None
    body = plan.to_dict()
    body["skipped_rules"] = [{"rule": r, "why": w} for r, w in plan.skipped_rules]
    typer.echo(json.dumps({"tenant": tenant, **body, "timeout_ms": timeout}, indent=2))


def _waits(given: list[str]) -> dict[Tier, float]:
    """``["large=12", ...]`` → ``{Tier.LARGE: 12.0, ...}``; a malformed one exits 2."""
    waits: dict[Tier, float] = {}
    for item in given:
        name, _, seconds = item.partition("=")
        try:
            waits[Tier(name.strip())] = float(seconds)
        except ValueError:
            raise _fail(f"--wait {item!r}: give TIER=SECONDS, e.g. large=12", 2) from None
    return waits
