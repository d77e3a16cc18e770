"""What-if for a draft: the tenant's recent ledger rows replayed through rules by the planner.

The ledger keeps no prompts. What it keeps of a request, and what replay feeds the planner
(``router.planner.decide``, the same function the edge calls):

| condition | replayed from |
| --- | --- |
| ``tenant``, ``app``, ``tag``, ``model`` | the row's tenant, app, tags, requested model |
| ``time`` | the row's ``created_at`` |
| ``score`` | the row's classifier score (a row without one: not replayable) |
| ``prompt_tokens`` | the row's counted prompt tokens (the estimate is not stored: approximate) |
| ``user``, ``turns``, ``messages``, ``last_message`` | **not stored** |
| ``queue_wait_s``, ``circuit_open`` | **not stored** (live signals of that moment) |

A row is *not replayable* under a rule set when its fate depends on a condition that cannot be
replayed: some rule it reaches (every rule before the one that fires is tried) has such a
condition, and all of that rule's replayable conditions hold. Such rows are counted, by rule
and condition, and left out of the prediction; nothing is guessed for them. A row replayable
under both the active and the draft rules is planned under each (no live signals: no spill-over,
no sticky conversations, no deadline), and priced at the first deployment of the plan, with the
row's own tokens (completion capped by a rule's ``max_tokens``) and list prices
(``PriceBook.charge``, as the ledger books); its baseline is the row's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import NamedTuple

from sqlalchemy import select

from backends.types import Usage
from gateway.accounting.ledger import SqlLedger
from gateway.accounting.prices import PriceBook
from gateway.accounting.reports import CostSums
from gateway.accounting.schema import ledger_entries
from router.catalog import Catalog, Signals, TenantPolicy, Tier
from router.classifier import Classifier
from router.errors import RoutingError
from router.features import PromptFeatures
from router.planner import decide
from router.rules import CompiledRule, Facts, RequestContext, RuleSet
from router.rules.evaluate import why_not

__all__ = [
    "MAX_REPLAY_ROWS",
    "NOT_STORED",
    "LedgerCall",
    "Prediction",
    "Replay",
    "Unreplayable",
    "ledger_calls",
    "replay",
]

MAX_REPLAY_ROWS = 50_000
"""The newest rows replayed at most (the answer says when there were more)."""
NOT_STORED = ("user", "turns", "messages", "last_message", "queue_wait_s", "circuit_open")
"""Conditions on what the ledger does not keep."""
APPROXIMATE = ("prompt_tokens",)
"""Conditions replayed from a stand-in (the counted prompt tokens for the edge's estimate)."""


@dataclass(frozen=True, slots=True)
class LedgerCall:
    """What replay reads of one ledger row."""

    created_at: datetime
    requested_model: str
    app: str | None
    tags: tuple[str, ...]
    score: float | None
    tier: str | None
    prompt_tokens: int
    completion_tokens: int
    cost_micro_usd: int | None
    baseline_micro_usd: int | None


async def ledger_calls(
    ledger: SqlLedger, tenant: str, *, days: int, now: datetime | None = None
) -> tuple[list[LedgerCall], bool]:
    """The tenant's routed rows (with a tier) of the last ``days`` days, newest first, at most
    ``MAX_REPLAY_ROWS``; and whether there were more."""
    c = ledger_entries.c
    since = (now or datetime.now(UTC)) - timedelta(days=days)
    query = (
        select(
            c.created_at,
            c.requested_model,
            c.app,
            c.tags,
            c.score,
            c.tier,
            c.prompt_tokens,
            c.completion_tokens,
            c.cost_micro_usd,
            c.baseline_micro_usd,
        )
        .where(c.tenant == tenant, c.created_at >= since, c.tier.is_not(None))
        .order_by(c.created_at.desc())
        .limit(MAX_REPLAY_ROWS + 1)
    )
    async with ledger.engine.connect() as conn:
        rows = (await conn.execute(query)).all()
    calls = [
        LedgerCall(
            created_at=r.created_at,
            requested_model=r.requested_model or "auto",
            app=r.app,
            tags=tuple(str(t) for t in (r.tags or ())),
            score=None if r.score is None else float(r.score),
            tier=r.tier,
            prompt_tokens=int(r.prompt_tokens or 0),
            completion_tokens=int(r.completion_tokens or 0),
            cost_micro_usd=r.cost_micro_usd,
            baseline_micro_usd=r.baseline_micro_usd,
        )
        for r in rows[:MAX_REPLAY_ROWS]
    ]
    return calls, len(rows) > MAX_REPLAY_ROWS


@dataclass(frozen=True, slots=True)
class _StoredScore:
    """The classifier as the ledger saw it: the row's score (none: it fails, as the planner
    treats a failing classifier); a target share still turns into a threshold by the real
    classifier's curve."""

    value: float | None
    real: Classifier

    def score(self, features: PromptFeatures) -> float:
        if self.value is None:
            raise LookupError("no score stored")
        return self.value

    def threshold_for_share(self, share: float) -> float:
        for_share = getattr(self.real, "threshold_for_share", None)
        if not callable(for_share):
            raise LookupError("the classifier has no share curve")
        return float(for_share(share))


class Routed(NamedTuple):
    """Where one replayed row went under a rule set, and what it cost there."""

    tier: str | None
    """``None``: the rule set refuses the row."""
    cost_micro_usd: int | None
    """``None``: its price is unknown."""
    baseline_micro_usd: int | None
    rule: str
    """What decided: ``rule:<id>``, ``auto:threshold``, … (``ledger`` for what was booked)."""


@dataclass(frozen=True, slots=True)
class Prediction:
    """What one rule set does with the replayed rows, summed as a cost report sums ledger rows
    (``CostSums``: requests, cost, baseline, saving, rows of unknown price)."""

    sums: CostSums
    large: int
    """Rows sent to the large tier."""
    refused: int
    """Rows the rules would refuse (a forbidden tier, nothing within a cost cap, …)."""
    by_rule: Mapping[str, int]
    """Rows per deciding ``rule`` of the plan."""

    @classmethod
    def of(cls, rows: Sequence[Routed]) -> Prediction:
        """The sums over the ``rows`` served (refused ones only counted); a saving counts
        where both costs are known."""
        routed = [r for r in rows if r.tier is not None]
        refused = len(rows) - len(routed)
        priced = [r.cost_micro_usd for r in routed if r.cost_micro_usd is not None]
        sums = CostSums(
            requests=len(routed),
            cost_micro_usd=sum(priced),
            baseline_micro_usd=sum(r.baseline_micro_usd or 0 for r in routed),
            savings_micro_usd=sum(
                r.baseline_micro_usd - r.cost_micro_usd
                for r in routed
                if r.baseline_micro_usd is not None and r.cost_micro_usd is not None
            ),
            unknown_price=len(routed) - len(priced),
        )
        large = sum(r.tier == Tier.LARGE.value for r in routed)
        return cls(sums, large, refused, MappingProxyType(Counter(r.rule for r in routed)))


@dataclass(frozen=True, slots=True)
class Unreplayable:
    """Rows whose fate under ``which`` rules hangs on ``conditions`` of rule ``rule``."""

    which: str
    """``active`` or ``draft``."""
    rule: str
    conditions: tuple[str, ...]
    rows: int


@dataclass(frozen=True, slots=True)
class Replay:
    rows: int
    """Routed rows read."""
    truncated: bool
    replayed: int
    booked: Prediction
    """What the ledger booked for the replayed rows."""
    active: Prediction
    draft: Prediction
    unreplayable: tuple[Unreplayable, ...]
    approximate: tuple[tuple[str, str], ...]
    """``(rule id, condition)`` replayed from a stand-in."""


def _blind(rule: CompiledRule, call: LedgerCall) -> tuple[str, ...]:
    """The conditions of ``rule`` that cannot be replayed on ``call``."""
    when = rule.when
    blind = [name for name in NOT_STORED if getattr(when, name) is not None]
    if when.score is not None and call.score is None:
        blind.append("score")
    return tuple(blind)


def _without(rule: CompiledRule, names: Sequence[str]) -> CompiledRule:
    when = rule.when.model_copy(update=dict.fromkeys(names))
    if "last_message" in names:
        return replace(rule, when=when, text=None, keywords=(), keyword_text=None)
    return replace(rule, when=when)


@dataclass(frozen=True, slots=True)
class _Planner:
    tenant: str
    policy: TenantPolicy
    catalog: Catalog
    classifier: Classifier | None
    prices: PriceBook
    signals: Signals

    def facts(self, call: LedgerCall, features: PromptFeatures) -> Facts:
        context = RequestContext(app=call.app, tags=call.tags, now=call.created_at)
        return Facts(
            self.tenant,
            call.requested_model,
            features,
            context,
            call.score,
            Signals(),
            self.catalog,
        )

    def blocker(self, rules: RuleSet, call: LedgerCall, facts: Facts) -> Unreplayable | None:
        """The first rule reached whose outcome on ``call`` rests on a condition not stored."""
        for rule in rules.rules:
            blind = _blind(rule, call)
            if blind:
                if why_not(_without(rule, blind), facts) is None:
                    return Unreplayable("", rule.id, blind, 1)
                continue  # fails on a stored condition, whatever the others say
            if why_not(rule, facts) is None:
                return None  # fires
        return None

    def plan(
        self, rules: RuleSet, call: LedgerCall, features: PromptFeatures
    ) -> tuple[str | None, int | None, str]:
        """Tier, cost (micro-dollars) and deciding rule of ``call`` under ``rules``."""
        classifier = None if self.classifier is None else _StoredScore(call.score, self.classifier)
        try:
            plan = decide(
                requested_model=call.requested_model,
                features=features,
                max_tokens=call.completion_tokens,
                policy=self.policy,
                catalog=self.catalog,
                signals=self.signals,
                classifier=classifier,
                rules=rules,
                context=RequestContext(app=call.app, tags=call.tags, now=call.created_at),
            )
        except RoutingError:
            return None, None, "refused"
        completion = call.completion_tokens
        if plan.max_tokens is not None:
            completion = min(completion, plan.max_tokens)
        usage = Usage(call.prompt_tokens, completion)
        charge = self.prices.charge(plan.deployments[0], usage, baseline=None)
        return plan.tier.value, charge.cost_micro_usd, plan.rule


def _features(call: LedgerCall) -> PromptFeatures:
    return PromptFeatures(
        last_user_text="",
        text="",
        estimated_prompt_tokens=call.prompt_tokens,
        n_messages=0,
        n_turns=0,
        has_system=False,
        has_code=False,
        has_math=False,
        n_options=0,
        script="none",
    )


def replay(
    calls: Sequence[LedgerCall],
    *,
    truncated: bool,
    tenant: str,
    active: RuleSet,
    draft: RuleSet,
    policy: TenantPolicy,
    catalog: Catalog,
    classifier: Classifier | None,
    prices: PriceBook,
    score_signals: Signals | None = None,
) -> Replay:
    """Predict ``calls`` under ``active`` and ``draft`` (pure CPU: run it in a thread).
    ``score_signals``: the tenant's recent-score table (``own_scores``, ``min_own_scores``; no
    other live signal is read), so a ``target_large_share`` is replayed on the curve it runs on."""
    signals = Signals()
    if score_signals is not None:
        signals = Signals(
            own_scores=score_signals.own_scores, min_own_scores=score_signals.min_own_scores
        )
    planner = _Planner(tenant, policy, catalog, classifier, prices, signals)
    booked: list[Routed] = []
    under_active: list[Routed] = []
    under_draft: list[Routed] = []
    blocked: dict[tuple[str, str, tuple[str, ...]], int] = {}
    replayed = 0
    for call in calls:
        features = _features(call)
        facts = planner.facts(call, features)
        blockers = [
            (which, planner.blocker(rules, call, facts))
            for which, rules in (("active", active), ("draft", draft))
        ]
        stuck = [(which, b) for which, b in blockers if b is not None]
        if stuck:
            for which, b in stuck:
                key = (which, b.rule, b.conditions)
                blocked[key] = blocked.get(key, 0) + 1
            continue
        replayed += 1
        booked.append(Routed(call.tier, call.cost_micro_usd, call.baseline_micro_usd, "ledger"))
        for rules, under in ((active, under_active), (draft, under_draft)):
            tier, cost, rule = planner.plan(rules, call, features)
            under.append(Routed(tier, cost, call.baseline_micro_usd, rule))
    approximate = tuple(
        (rule.id, name)
        for rules in (active, draft)
        for rule in rules.rules
        for name in APPROXIMATE
        if getattr(rule.when, name) is not None
    )
    return Replay(
        rows=len(calls),
        truncated=truncated,
        replayed=replayed,
        booked=Prediction.of(booked),
        active=Prediction.of(under_active),
        draft=Prediction.of(under_draft),
        unreplayable=tuple(
            Unreplayable(which, rule, conditions, n)
            for (which, rule, conditions), n in sorted(blocked.items())
        ),
        approximate=tuple(dict.fromkeys(approximate)),
    )
