"""First match wins: which rule fires for a request, and why each earlier one did not.

Pure and cheap: comparisons on in-memory values and one precompiled regex per text condition.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from router.catalog import Catalog, Signals, Tier
from router.features import PromptFeatures
from router.rules.compiled import CompiledRule, RuleSet
from router.rules.context import RequestContext
from router.rules.schema import Range, TimeWindow

__all__ = ["Facts", "Match", "first_match"]

_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


@dataclass(frozen=True, slots=True)
class Facts:
    """Everything a condition may test, for one request."""

    tenant: str
    requested_model: str
    features: PromptFeatures
    context: RequestContext
    score: float | None
    signals: Signals
    catalog: Catalog
    lowered: str = ""
    """The last user message lower-cased, when some rule has case-insensitive keywords."""
    alias_of: str | None = None
    """The name the client sent, when an alias turned it into ``requested_model``."""


@dataclass(frozen=True, slots=True)
class Match:
    rule: CompiledRule | None
    skipped: tuple[tuple[str, str], ...]
    """``(rule id, why it did not match)`` for every rule tried before the match."""


def _number(value: float) -> str:
    return f"{value:g}"


def _outside(value: float, bounds: Range) -> str | None:
    """Why ``value`` is outside ``bounds``, or ``None`` when inside."""
    if bounds.gt is not None and not value > bounds.gt:
        return f"{_number(value)} is not > {_number(bounds.gt)}"
    if bounds.gte is not None and not value >= bounds.gte:
        return f"{_number(value)} is not ≥ {_number(bounds.gte)}"
    if bounds.lt is not None and not value < bounds.lt:
        return f"{_number(value)} is not < {_number(bounds.lt)}"
    if bounds.lte is not None and not value <= bounds.lte:
        return f"{_number(value)} is not ≤ {_number(bounds.lte)}"
    return None


def _one_of(what: str, value: str | None, allowed: tuple[str, ...]) -> str | None:
    if value is not None and value in allowed:
        return None
    return f"{what} {value!r} not in {list(allowed)}"


def _in_window(rule: CompiledRule, window: TimeWindow, facts: Facts) -> str | None:
    now = facts.context.now
    if now is None or rule.zone is None:
        return "time: no request time"
    local = now.astimezone(rule.zone)
    day = _DAYS[local.weekday()]
    if window.days and day not in window.days:
        return f"time: {day} not in {list(window.days)}"
    clock = f"{local.hour:02d}:{local.minute:02d}"
    inside = (
        window.after <= clock < window.before
        if window.after <= window.before
        else clock >= window.after or clock < window.before
    )
    if inside:
        return None
    return f"time: {clock} {window.tz} outside [{window.after}, {window.before})"


def _open(name: str, facts: Facts) -> bool:
    unavailable = facts.signals.unavailable
    try:
        tier = Tier(name)
    except ValueError:
        return name in unavailable
    members = facts.catalog.of_tier(tier)
    return bool(members) and all(d.model in unavailable for d in members)


def _metadata(rule: CompiledRule, facts: Facts) -> str | None:
    when, ctx = rule.when, facts.context
    if when.tenant is not None and (why := _one_of("tenant", facts.tenant, when.tenant)):
        return why
    if when.app is not None and (why := _one_of("app", ctx.app, when.app)):
        return why
    if when.tag is not None and not set(ctx.tags) & set(when.tag):
        return f"tags {list(ctx.tags)} share none of {list(when.tag)}"
    if when.user is not None and (why := _one_of("user", ctx.user, when.user)):
        return why
    if when.model is not None and facts.alias_of not in when.model:
        why = _one_of("model", facts.requested_model, when.model)
        if why:
            return why
    return None


def _text_matches(rule: CompiledRule, facts: Facts) -> bool:
    text = facts.features.last_user_text
    if rule.text is not None and rule.text.search(text) is not None:
        return True
    if not rule.keywords or rule.keyword_text is None:
        return False
    haystack = text if rule.case_sensitive else facts.lowered
    if not any(k in haystack for k in rule.keywords):
        return False
    return rule.keyword_text.search(text) is not None


def _prompt(rule: CompiledRule, facts: Facts) -> str | None:
    when, features = rule.when, facts.features
    checks: tuple[tuple[str, Range | None, float], ...] = (
        ("prompt_tokens", when.prompt_tokens, features.estimated_prompt_tokens),
        ("turns", when.turns, features.n_turns),
        ("messages", when.messages, features.n_messages),
    )
    for name, bounds, value in checks:
        if bounds is not None and (why := _outside(value, bounds)):
            return f"{name}: {why}"
    if (rule.text is not None or rule.keywords) and not _text_matches(rule, facts):
        return "last_message: no match"
    if when.score is not None:
        if facts.score is None:
            return "score: no classifier score"
        if why := _outside(facts.score, when.score):
            return f"score: {why}"
    return None


def _live(rule: CompiledRule, facts: Facts) -> str | None:
    when = rule.when
    if when.time is not None and (why := _in_window(rule, when.time, facts)):
        return why
    for tier, bounds in (when.queue_wait_s or {}).items():
        wait = facts.signals.expected_wait_s.get(tier)
        if wait is None:
            return f"queue_wait_s.{tier.value}: no estimate"
        if why := _outside(wait, bounds):
            return f"queue_wait_s.{tier.value}: {why}"
    if when.circuit_open is not None and not any(_open(n, facts) for n in when.circuit_open):
        return f"circuit_open: none of {list(when.circuit_open)} is open"
    return None


_CHECKS: tuple[Callable[[CompiledRule, Facts], str | None], ...] = (_metadata, _prompt, _live)


def why_not(rule: CompiledRule, facts: Facts) -> str | None:
    """The first condition of ``rule`` that fails on ``facts``, or ``None`` if all hold."""
    for check in _CHECKS:
        if why := check(rule, facts):
            return why
    return None


def first_match(rules: RuleSet, facts: Facts) -> Match:
    skipped: list[tuple[str, str]] = []
    for rule in rules.rules:
        why = why_not(rule, facts)
        if why is None:
            return Match(rule, tuple(skipped))
        skipped.append((rule.id, why))
    return Match(None, tuple(skipped))
