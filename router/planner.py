"""The planner: request features + tenant policy + rules + catalog + live signals → ``RoutePlan``.

``decide`` is pure: no I/O, no logging, no clock, no randomness. The same inputs give the same
plan, which is what ``/v1/route/explain`` shows (the request time and the conversation's sticky
tier come in through ``context``).

How a plan is made:

00. **Aliases.** A requested name that is not ``auto``, a tier or a deployment id is looked up in
   the model aliases (``router.aliases``: the tenant's rules file, the tenant's own, the global
   ones), and the plan is made for its target; ``requested_model`` keeps the name sent, ``alias``
   the alias that matched. Rule conditions on ``model`` match either name.
0. **Rules.** The tenant's rules, then the global ones, are tried in order; the first that
   matches fires (``rule:<id>``), and the plan records why each earlier one did not. Its
   actions narrow the allowed tiers (``forbid_tiers``, ``forbid_external``), set the threshold
   (or a target large share), cap ``max_tokens`` and the worst-case cost, set priority, the
   fallback chain and mid-stream continuation, and may pick a tier or a deployment.
1. **Primary tier.** A rule's tier or deployment wins. Otherwise ``auto`` scores the prompt
   (score ≥ threshold → large, else small; no classifier → the tenant's default tier; a failing
   classifier fails open to the default tier, rule ``classifier_failed``) and, if the tier is
   not allowed, takes the nearest allowed one in fallback order. A tier name pins that tier; a
   deployment id (or a rule's ``deployment``) pins that deployment, followed only by its
   configured ``fallbacks`` (``DeploymentSpec.fallbacks``; with a rule's ``fallback`` tiers,
   their deployments after them), never by the rest of its tier. For ``auto``, a conversation that
   went large stays large (``sticky:conversation``) unless the fired rule says
   ``sticky: false``; and when the large tier's expected wait is over its target (default
   30 s), traffic spills to the first tier of ``spill_to`` that can serve it
   (``spill:large_wait``). Under the target, it also spills when the large tier is *late* for
   the request's deadline (``router.deadline``: its wait plus a typical job is more than
   ``context.time_left_s``), to the first tier of ``spill_to`` that can serve it and is not late
   too (``spill:deadline``; the rules' ``spill_on_deadline: false`` turns this off). A tier
   *can serve* a request when it is allowed and has a deployment that the plan would start on
   (steps 3 to 5: it holds the request, is within the cost cap, is not unavailable); a spill that
   finds none leaves the plan on the large tier, with its own rule, and the reason says so.
2. **Fallback chain.** After the primary tier: the rule's ``fallback``, else small → large →
   external; large → external → small; external → large → small; allowed tiers only.
3. **Context fit.** Deployments whose ``max_model_len`` cannot hold the estimated prompt plus
   ``max_tokens`` are dropped; if the primary tier keeps none, the first tier of the chain
   that does becomes primary (the reason says so). None at all → ``NoDeploymentFits``.
4. **Cost cap.** With ``max_cost_usd``, deployments whose worst case (prompt + ``max_tokens``
   at list price) is over the cap, or whose price is unknown, are dropped.
5. **Capabilities.** Before steps 1 to 4, deployments that lack a capability the request needs
   (images, tools, a JSON schema, reasoning parameters: ``router.capabilities``) are left out,
   and the plan's ``ruled_out`` says which capability ruled out each; a spill considers only
   the deployments left. A request pinned to a deployment that lacks one, or that no
   deployment of its allowed tiers can serve, gets ``MissingCapability``. A request that named
   its model through an alias has its reasoning parameters and ``verbosity`` as *hints*
   (``router.capabilities.HINTED``): they rule nothing out, and the plan's ``dropped`` says
   which deployments are not sent which of them (``router.capabilities.unsent``). A reasoning
   field that asks for no reasoning (``reasoning_effort: "none"``) is such a hint however the
   model is named.
6. **Live signals.** Deployments in ``signals.unavailable`` move to the end, in order; the plan's
   ``tier`` is the tier of the first deployment to try.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from types import MappingProxyType
from typing import Any

from router.aliases import Alias
from router.capabilities import HINTED, Capability, Screen, screen, unsent
from router.catalog import Catalog, DeploymentSpec, Signals, TenantPolicy, Tier
from router.classifier import Classifier
from router.deadline import tier_fit
from router.errors import ModelNotAllowed, NoDeploymentFits, UnknownModel
from router.features import PromptFeatures
from router.plan import RoutePlan
from router.rules.compiled import CompiledRule, RuleSet
from router.rules.context import RequestContext
from router.rules.evaluate import Facts, Match, first_match
from router.rules.schema import Action
from router.share import ShareCurve, ShareSource

__all__ = ["AUTO", "FALLBACK_ORDER", "decide"]

AUTO = "auto"
FALLBACK_ORDER = MappingProxyType(
    {
        Tier.SMALL: (Tier.SMALL, Tier.LARGE, Tier.EXTERNAL),
        Tier.LARGE: (Tier.LARGE, Tier.EXTERNAL, Tier.SMALL),
        Tier.EXTERNAL: (Tier.EXTERNAL, Tier.LARGE, Tier.SMALL),
    }
)
"""Each tier, then the tiers to fall back to, nearest first."""
_NO_RULES = RuleSet()
_NO_CONTEXT = RequestContext()
_NO_ACTION = Action()
_NO_MATCH = Match(None, ())


@dataclass(frozen=True, slots=True)
class _Choice:
    """The primary tier and why, before allowed tiers, context fit and signals apply."""

    tier: Tier
    rule: str
    reason: str
    score: float | None = None


@dataclass(frozen=True, slots=True)
class _Score:
    value: float | None
    failure: str | None = None


@dataclass(frozen=True, slots=True)
class _Effective:
    """The request's policy once the fired rule's actions apply."""

    policy: TenantPolicy
    action: Action
    rule: CompiledRule | None
    max_tokens: int
    no_external: bool
    share: ShareSource | None = None
    """How a ``target_large_share`` became the threshold."""

    @property
    def label(self) -> str | None:
        return None if self.rule is None else f"rule:{self.rule.id}"

    def needed(self, prompt_tokens: int) -> int:
        """Tokens a deployment must hold: the estimated prompt plus ``max_tokens``."""
        return prompt_tokens + max(0, self.max_tokens)

    def refuse(self, what: str) -> ModelNotAllowed:
        by = f" (rule {self.rule.id})" if self.rule is not None else ""
        return ModelNotAllowed(f"tenant {self.policy.tenant!r} may not use {what}{by}")


def decide(
    *,
    requested_model: str,
    features: PromptFeatures,
    max_tokens: int,
    policy: TenantPolicy,
    catalog: Catalog,
    signals: Signals,
    classifier: Classifier | None,
    rules: RuleSet | None = None,
    context: RequestContext | None = None,
    needs: frozenset[Capability] = frozenset(),
    hints: tuple[str, ...] = (),
    quiet: tuple[str, ...] = (),
) -> RoutePlan:
    """The route plan for one request (see the module docstring for the rules). ``needs``: the
    capabilities the request needs (``router.capabilities.needed_capabilities``); ``hints``:
    its fields that are hints when it names its model through an alias
    (``router.capabilities.hint_fields``); ``quiet``: those that are hints however it names
    its model, since they ask for no reasoning (``router.capabilities.no_reasoning_fields``).

    Raises ``UnknownModel``, ``ModelNotAllowed``, ``NoDeploymentFits`` or
    ``MissingCapability``.
    """
    rules = rules or _NO_RULES
    context = context or _NO_CONTEXT
    asked = requested_model
    alias = _alias(requested_model, rules, policy, catalog)
    if alias is not None:
        requested_model = alias.target
    tier = _tier_named(requested_model)
    pinned = None
    if requested_model != AUTO and tier is None:
        pinned = catalog.get(requested_model)
        if pinned is None:
            raise UnknownModel(
                f"unknown model {requested_model!r}: use 'auto', a tier "
                f"({', '.join(t.value for t in Tier)}), a deployment's model id or an alias"
            )
    wants_score = classifier is not None and (requested_model == AUTO or rules.uses_score)
    score = _score(features, classifier) if wants_score else _Score(None)
    match = _NO_MATCH
    if rules.rules:
        lowered = features.last_user_text.lower() if rules.uses_lowered_text else ""
        facts = Facts(
            policy.tenant, requested_model, features, context, score.value, signals, catalog,
            lowered, None if alias is None else asked,
        )  # fmt: skip
        match = first_match(rules, facts)
    eff = _effective(policy, match.rule, max_tokens, classifier, signals)
    prompt_tokens = features.estimated_prompt_tokens
    needed = eff.needed(prompt_tokens)
    action = eff.action
    extras: dict[str, Any] = {"requested_model": asked}
    if alias is not None:
        extras["alias"] = f"{alias.pattern} → {alias.target}"
    if match.rule is not None or match.skipped:
        extras.update(
            skipped_rules=match.skipped,
            max_tokens=action.max_tokens,
            priority=action.priority,
            continuation=action.continuation,
            max_cost_usd=None if action.max_cost_usd is None else str(action.max_cost_usd),
        )
    needs, hints = _as_hints(needs, hints, quiet, alias)
    able = screen(catalog, needs)
    if requested_model == AUTO:
        extras["threshold"] = eff.policy.threshold
        if eff.share is not None:
            extras["share_source"] = eff.share
    plan = _named_plan(pinned, eff, score, needed, signals, extras, able)
    if plan is None:
        able.require_any(_allowed(eff, catalog))
        choice = _choose(tier, eff, score, rules, context, signals, able.catalog, prompt_tokens)
        plan = _tier_plan(choice, needed=needed, eff=eff, catalog=able.catalog,
                          signals=signals, prompt_tokens=prompt_tokens, extras=extras)  # fmt: skip
    plan = _drop_hints(able.annotate(plan), hints, catalog, alias is not None)
    if alias is None:
        return plan
    said = f"{asked!r} is an alias of {alias.target!r}"
    if alias.pattern != asked:
        said += f" ({alias.pattern})"
    return replace(plan, reason=f"{said}; {plan.reason}")


def _as_hints(
    needs: frozenset[Capability],
    hints: tuple[str, ...],
    quiet: tuple[str, ...],
    alias: Alias | None,
) -> tuple[frozenset[Capability], tuple[str, ...]]:
    """What the request needs and its hints: through an alias, its ``hints`` need nothing;
    named directly, only its ``quiet`` fields are hints (the rest stay needs)."""
    if alias is None:
        return needs, quiet
    return (needs - HINTED if hints else needs), hints


def _drop_hints(
    plan: RoutePlan, hints: tuple[str, ...], catalog: Catalog, aliased: bool
) -> RoutePlan:
    """``plan`` with the ``hints`` each of its deployments is not sent (``dropped``), and
    those at the end of its reason."""
    dropped = tuple(
        (d, fields)
        for d in plan.deployments
        if (spec := catalog.get(d)) is not None and (fields := unsent(hints, spec))
    )
    if not dropped:
        return plan
    said = "; ".join(f"{d}: {', '.join(f)}" for d, f in dropped)
    why = "alias" if aliased else "no reasoning asked"
    reason = f"{plan.reason}; hints not sent ({why}) to {said}"
    return replace(plan, dropped=dropped, reason=reason)


def _alias(name: str, rules: RuleSet, policy: TenantPolicy, catalog: Catalog) -> Alias | None:
    """The alias ``name`` stands for, if it is not already a model (``auto``, a tier, a
    deployment id)."""
    if name == AUTO or _tier_named(name) is not None or catalog.get(name) is not None:
        return None
    if not (rules.aliases or policy.aliases or catalog.aliases):
        return None
    return rules.aliases.then(policy.aliases).then(catalog.aliases).resolve(name)


def _allowed(eff: _Effective, catalog: Catalog) -> list[DeploymentSpec]:
    """Every deployment of the tiers the request may use."""
    return [d for t in Tier if t in eff.policy.allowed_tiers for d in _candidates(t, eff, catalog)]


def _tier_named(name: str) -> Tier | None:
    try:
        return Tier(name)
    except ValueError:
        return None


def _effective(
    policy: TenantPolicy,
    rule: CompiledRule | None,
    max_tokens: int,
    classifier: Classifier | None,
    signals: Signals,
) -> _Effective:
    if rule is None:
        return _Effective(policy, _NO_ACTION, None, max_tokens, False)
    action = rule.then
    forbidden = set(action.forbid_tiers)
    if action.forbid_external:
        forbidden.add(Tier.EXTERNAL)
    threshold = policy.threshold
    share: ShareSource | None = None
    if action.threshold is not None:
        threshold = action.threshold
    elif action.target_large_share is not None:
        threshold, share = _share_threshold(
            action.target_large_share, policy.threshold, classifier, signals
        )
    effective = replace(policy, allowed_tiers=policy.allowed_tiers - forbidden, threshold=threshold)
    capped = max_tokens if action.max_tokens is None else min(max_tokens, action.max_tokens)
    return _Effective(effective, action, rule, capped, action.forbid_external, share)


def _share_threshold(
    target: float, fallback: float, classifier: Classifier | None, signals: Signals
) -> tuple[float, ShareSource | None]:
    """The threshold for ``target`` share large: off the tenant's own recent scores when it has
    at least ``signals.min_own_scores`` of them, else off the classifier's documented-mix
    curve; a classifier without one keeps ``fallback`` (the tenant's threshold)."""
    own = signals.own_scores
    if own is not None and own.count >= signals.min_own_scores:
        source = ShareSource(target, ShareCurve.TENANT, own.count, own.window_days)
        return own.threshold_for_share(target), source
    for_share = getattr(classifier, "threshold_for_share", None)
    if not callable(for_share):
        return fallback, None
    scores = None if own is None else own.count
    source = ShareSource(target, ShareCurve.MIX, scores, min_scores=signals.min_own_scores)
    return float(for_share(target)), source


def _two_numbers(score: float, threshold: float) -> tuple[str, str]:
    """Score and threshold with 2 decimals, or more where 2 would make them look equal."""
    for digits in (2, 3, 4, 6):
        shown = f"{score:.{digits}f}", f"{threshold:.{digits}f}"
        if shown[0] != shown[1] or score == threshold:
            return shown
    return f"{score!r}", f"{threshold!r}"


def _score(features: PromptFeatures, classifier: Classifier | None) -> _Score:
    if classifier is None:
        return _Score(None)
    try:
        value = float(classifier.score(features))
    except Exception as exc:  # noqa: BLE001 — fail open: any classifier error routes by default
        return _Score(None, f"classifier failed ({type(exc).__name__})")
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        return _Score(None, f"classifier returned {value!r}, not in [0, 1]")
    return _Score(value)


def _auto_choice(score: _Score, policy: TenantPolicy, has_classifier: bool) -> _Choice:
    default = policy.default_tier
    if score.failure is not None:
        return _Choice(default, "classifier_failed", f"{score.failure} → default tier {default}")
    if score.value is None or not has_classifier:
        return _Choice(default, "auto:default", f"no classifier → default tier {default.value}")
    shown, limit = _two_numbers(score.value, policy.threshold)
    if score.value >= policy.threshold:
        reason = f"score {shown} ≥ threshold {limit} → large"
        return _Choice(Tier.LARGE, "auto:threshold", reason, score.value)
    reason = f"score {shown} < threshold {limit} → small"
    return _Choice(Tier.SMALL, "auto:threshold", reason, score.value)


def _choose(
    tier: Tier | None,
    eff: _Effective,
    score: _Score,
    rules: RuleSet,
    context: RequestContext,
    signals: Signals,
    catalog: Catalog,
    prompt_tokens: int,
) -> _Choice:
    action, label = eff.action, eff.label
    why = f"rule {eff.rule.id}" if eff.rule is not None else ""
    if eff.rule is not None and eff.rule.description:
        why += f" ({eff.rule.description})"
    if action.tier is not None and label is not None:
        return _Choice(action.tier, label, f"{why} → {action.tier.value}", score.value)
    if tier is not None:
        if tier not in eff.policy.allowed_tiers:
            raise eff.refuse(f"tier {tier.value!r}")
        reason = f"tier {tier.value} requested" + (f"; {why}" if why else "")
        return _Choice(tier, label or "pin:tier", reason, score.value)
    choice = _auto_choice(score, eff.policy, score.value is not None or score.failure is not None)
    if label is not None:
        if eff.share is not None and choice.rule == "auto:threshold":
            why += f"; {eff.share.describe()}"
        choice = replace(choice, rule=label, reason=f"{why}; {choice.reason}")
    if choice.tier is Tier.SMALL and context.sticky_tier is Tier.LARGE and action.sticky:
        reason = f"{choice.reason}; conversation went large before → stays large"
        choice = replace(choice, tier=Tier.LARGE, rule="sticky:conversation", reason=reason)
    if choice.tier is not Tier.LARGE:
        return choice
    targets = _spill_tiers(eff, rules, catalog, signals, prompt_tokens)
    wait = signals.expected_wait_s.get(Tier.LARGE)
    if wait is not None and wait > rules.wait_target_s:
        return _spill(choice, rules, wait, targets)
    return _deadline_spill(choice, rules, signals, context, targets)


def _spill_tiers(
    eff: _Effective, rules: RuleSet, catalog: Catalog, signals: Signals, prompt_tokens: int
) -> Iterator[Tier]:
    """The tiers of ``spill_to``, in order, that can serve the request: allowed, not the large
    tier, and with a deployment the plan would start on (it holds the request, is within the
    rule's cost cap and is not unavailable). Another tier would only be fallen back off again,
    often onto the large tier, with the plan still labelled a spill. Lazy: only a spill asks."""
    needed = eff.needed(prompt_tokens)
    cap = eff.action.max_cost_usd
    for tier in rules.spill_order:
        if tier is Tier.LARGE or tier not in eff.policy.allowed_tiers:
            continue
        if any(
            d.max_model_len >= needed
            and d.model not in signals.unavailable
            and (cap is None or _costs_at_most(d, cap, prompt_tokens, eff.max_tokens))
            for d in _candidates(tier, eff, catalog)
        ):
            yield tier


def _spill(choice: _Choice, rules: RuleSet, wait: float, targets: Iterator[Tier]) -> _Choice:
    """``auto`` traffic bound for a large tier whose expected wait is over target moves to the
    first tier of ``spill_to`` that can serve it; with none, it stays and the reason says so."""
    why = f"large tier's expected wait {wait:.1f} s > target {rules.wait_target_s:g} s"
    tier = next(targets, None)
    if tier is None:
        return replace(
            choice, reason=f"{choice.reason}; {why}, but no tier to spill to can serve it"
        )
    reason = f"{choice.reason}; {why} → {tier.value}"
    return replace(choice, tier=tier, rule="spill:large_wait", reason=reason)


def _deadline_spill(
    choice: _Choice,
    rules: RuleSet,
    signals: Signals,
    context: RequestContext,
    targets: Iterator[Tier],
) -> _Choice:
    """``auto`` traffic bound for a large tier it cannot start on before its deadline moves to
    the first tier of ``spill_to`` that can serve it and is not late too."""
    left = context.time_left_s
    if left is None or not rules.deadline_spill:
        return choice
    large = tier_fit(Tier.LARGE, left, signals)
    if not large.late:
        return choice
    why = f"deadline in {left:.1f} s: {large.describe()} does not fit"
    late: list[str] = []
    for tier in targets:
        there = tier_fit(tier, left, signals)
        if there.late:
            late.append(f"{there.describe()} neither")
            continue
        reason = f"{choice.reason}; {why} → {tier.value}"
        if late:
            reason += f" ({'; '.join(late)})"
        return replace(choice, tier=tier, rule="spill:deadline", reason=reason)
    return replace(choice, reason=f"{choice.reason}; {why}, nor does any tier to spill to")


def _chain(tier: Tier, eff: _Effective) -> tuple[Tier, ...]:
    order: Sequence[Tier] = FALLBACK_ORDER[tier]
    if eff.action.fallback is not None:
        order = (tier, *(t for t in eff.action.fallback if t is not tier))
    return tuple(t for t in order if t in eff.policy.allowed_tiers)


def _candidates(tier: Tier, eff: _Effective, catalog: Catalog) -> tuple[DeploymentSpec, ...]:
    found = catalog.of_tier(tier)
    if eff.no_external:
        found = tuple(d for d in found if not d.external)
    return found


def _tier_plan(
    choice: _Choice,
    *,
    needed: int,
    eff: _Effective,
    catalog: Catalog,
    signals: Signals,
    prompt_tokens: int,
    extras: dict[str, Any],
) -> RoutePlan:
    tier = choice.tier
    chain = _chain(tier, eff)
    if not chain:
        raise eff.refuse(f"tier {tier.value!r} or any tier to fall back to")
    notes = [choice.reason]
    if chain[0] is not tier:
        notes.append(f"{tier.value} not allowed → {chain[0].value}")
    options = {t: _candidates(t, eff, catalog) for t in chain}
    fitting = {t: tuple(d for d in options[t] if d.max_model_len >= needed) for t in chain}
    usable = [t for t in chain if fitting[t]]
    if not usable:
        raise NoDeploymentFits(_no_fit_message(needed, [d for t in chain for d in options[t]]))
    if usable[0] is not chain[0]:
        notes.append(_moved_note(chain[0], usable[0], needed, catalog))
    ordered = [d for t in usable for d in fitting[t]]
    ordered = _within_cost(ordered, eff, prompt_tokens, notes)
    deployments = _available_first(ordered, signals)
    first = deployments[0]
    if first.tier is not usable[0]:
        notes.append(f"{usable[0].value} unavailable → {first.tier.value} first")
    return RoutePlan(
        tier=first.tier,
        deployments=tuple(d.model for d in deployments),
        rule=choice.rule,
        reason="; ".join(notes),
        score=choice.score,
        preferred=ordered[0].model if first is not ordered[0] else None,
        **extras,
    )


def _within_cost(
    ordered: list[DeploymentSpec], eff: _Effective, prompt_tokens: int, notes: list[str]
) -> list[DeploymentSpec]:
    cap = eff.action.max_cost_usd
    if cap is None:
        return ordered
    kept = [d for d in ordered if _costs_at_most(d, cap, prompt_tokens, eff.max_tokens)]
    if not kept:
        raise eff.refuse(f"any deployment within ${cap} per request")
    if len(kept) < len(ordered):
        dropped = ", ".join(d.model for d in ordered if d not in kept)
        notes.append(f"over ${cap} per request (or unpriced): {dropped}")
    return kept


def _costs_at_most(spec: DeploymentSpec, cap: Decimal, prompt: int, max_tokens: int) -> bool:
    worst = spec.worst_cost(prompt, max_tokens)
    return worst is not None and worst <= cap


def _named_plan(
    pinned: DeploymentSpec | None,
    eff: _Effective,
    score: _Score,
    needed: int,
    signals: Signals,
    extras: dict[str, Any],
    able: Screen,
) -> RoutePlan | None:
    """The plan for a deployment a rule's ``deployment`` action or the request names
    (``pinned``); ``None``: neither does (or the rule's lacks a capability the request needs),
    the plan goes by tier."""
    action = eff.action
    named = able.catalog.get(action.deployment) if action.deployment is not None else None
    if named is not None and eff.rule is not None:
        why = f"rule {eff.rule.id}"
        if eff.rule.description:
            why += f" ({eff.rule.description})"
        reason = f"{why} → {named.model}"
        return _model_plan(
            named, needed, eff, signals, extras, able, reason=reason, score=score.value
        )
    if action.tier is None and action.deployment is None and pinned is not None:
        return _model_plan(pinned, needed, eff, signals, extras, able)
    return None


def _model_plan(
    spec: DeploymentSpec,
    needed: int,
    eff: _Effective,
    signals: Signals,
    extras: dict[str, Any],
    able: Screen,
    *,
    reason: str | None = None,
    score: float | None = None,
) -> RoutePlan:
    """The plan for one named deployment (by the request, or by a rule's ``deployment``
    action, ``reason`` then): it, then its configured ``fallbacks`` (allowed, fitting, within
    the cost cap), then, for a rule that says ``fallback``, those tiers' deployments. Nothing
    else: a request for one deployment is never answered by an unrelated one."""
    policy = eff.policy
    if spec.tier not in policy.allowed_tiers or (eff.no_external and spec.external):
        raise eff.refuse(f"{spec.model!r} (tier {spec.tier.value})")
    by_rule = reason is not None
    allowed = policy.allowed_models
    if not by_rule and allowed is not None and spec.model not in allowed:
        raise ModelNotAllowed(f"tenant {policy.tenant!r} may not use {spec.model!r}")
    lacking = able.pinned_refusal(spec)
    if lacking is not None:
        raise lacking
    chain = [spec, *_fallbacks(spec, eff, able.catalog)]
    fitting = [d for d in chain if d.max_model_len >= needed]
    if not fitting:
        raise NoDeploymentFits(_no_fit_message(needed, chain))
    notes = [reason or f"model {spec.model} requested"]
    if eff.rule is not None and not by_rule:
        notes[0] += f"; rule {eff.rule.id}"
    if len(chain) > 1:
        notes.append(f"fallbacks: {' → '.join(d.model for d in chain[1:])}")
    if fitting[0] is not spec:
        notes.append(f"{spec.model} does not fit {needed:,} tokens → {fitting[0].model}")
    cap = eff.action.max_cost_usd
    prompt_tokens = needed - eff.max_tokens
    alone = len(fitting) == 1  # the deployment alone: refused by name
    if (
        alone
        and cap is not None
        and not _costs_at_most(fitting[0], cap, prompt_tokens, eff.max_tokens)
    ):
        raise eff.refuse(f"{fitting[0].model!r} within ${cap} per request")
    ordered = _within_cost(fitting, eff, prompt_tokens, notes)
    deployments = _available_first(ordered, signals)
    if spec.model in signals.unavailable:
        notes[0] += " (currently unavailable)"
    first = deployments[0]
    return RoutePlan(
        tier=first.tier,
        deployments=tuple(d.model for d in deployments),
        rule=eff.label or "pin:model",
        reason="; ".join(notes),
        score=score,
        preferred=ordered[0].model if first is not ordered[0] else None,
        fallbacks_of=spec.model if len(chain) > 1 else None,
        **extras,
    )


def _fallbacks(spec: DeploymentSpec, eff: _Effective, catalog: Catalog) -> list[DeploymentSpec]:
    """``spec``'s configured fallbacks, then (a rule's ``fallback`` action) the deployments of
    those tiers: the allowed ones, each once."""
    found = [d for d in (catalog.get(m) for m in spec.fallbacks) if d is not None]
    for tier in eff.action.fallback or ():
        found.extend(_candidates(tier, eff, catalog))
    out: list[DeploymentSpec] = []
    for d in found:
        allowed = d.tier in eff.policy.allowed_tiers and not (eff.no_external and d.external)
        if allowed and d is not spec and d not in out:
            out.append(d)
    return out


def _available_first(
    deployments: Sequence[DeploymentSpec], signals: Signals
) -> list[DeploymentSpec]:
    """Stable partition: available deployments in order, then the unavailable ones in order."""
    available = [d for d in deployments if d.model not in signals.unavailable]
    return available + [d for d in deployments if d.model in signals.unavailable]


def _moved_note(tier: Tier, to: Tier, needed: int, catalog: Catalog) -> str:
    if not catalog.of_tier(tier):
        return f"no {tier.value} deployment → {to.value}"
    return f"no {tier.value} deployment fits {needed:,} tokens → {to.value}"


def _no_fit_message(needed: int, candidates: Sequence[DeploymentSpec]) -> str:
    if not candidates:
        return "no deployment is configured for the tiers this request may use"
    largest = max(d.max_model_len for d in candidates)
    return (
        f"no allowed deployment fits {needed:,} tokens (estimated prompt + max_tokens); "
        f"the largest max_model_len is {largest:,}"
    )
