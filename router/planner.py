"""The planner: request features + tenant policy + catalog + live signals → ``RoutePlan``.

``decide`` is pure: no I/O, no logging, no clock, no randomness. The same inputs give the same
plan, which is what ``/v1/route/explain`` shows.

How a plan is made:

1. **Primary tier.** ``auto`` scores the prompt (score ≥ ``policy.threshold`` → large, else
   small; no classifier → the tenant's default tier; a failing classifier fails open to the
   default tier, rule ``classifier_failed``) and, if the tier is not allowed, takes the nearest
   allowed one in fallback order. A tier name pins that tier; a deployment id pins that
   deployment alone (no fallback).
2. **Fallback chain.** After the primary tier: small → large → external; large → external →
   small; external → large → small; allowed tiers only.
3. **Context fit.** Deployments whose ``max_model_len`` cannot hold the estimated prompt plus
   ``max_tokens`` are dropped; if the primary tier keeps none, the first tier of the chain
   that does becomes primary (the reason says so). None at all → ``NoDeploymentFits``.
4. **Live signals.** Deployments in ``signals.unavailable`` move to the end, in order; the plan's
   ``tier`` is the tier of the first deployment to try.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType

from router.catalog import Catalog, DeploymentSpec, Signals, TenantPolicy, Tier
from router.classifier import Classifier
from router.errors import ModelNotAllowed, NoDeploymentFits, UnknownModel
from router.features import PromptFeatures
from router.plan import RoutePlan

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


@dataclass(frozen=True, slots=True)
class _Choice:
    """The primary tier and why, before allowed tiers, context fit and signals apply."""

    tier: Tier
    rule: str
    reason: str
    score: float | None = None


def decide(
    *,
    requested_model: str,
    features: PromptFeatures,
    max_tokens: int,
    policy: TenantPolicy,
    catalog: Catalog,
    signals: Signals,
    classifier: Classifier | None,
) -> RoutePlan:
    """The route plan for one request (see the module docstring for the rules).

    Raises ``UnknownModel``, ``ModelNotAllowed`` or ``NoDeploymentFits``.
    """
    needed = features.estimated_prompt_tokens + max(0, max_tokens)
    tier = _tier_named(requested_model)
    if requested_model == AUTO or tier is not None:
        if tier is None:
            choice = _auto_choice(features, policy, classifier)
        elif tier in policy.allowed_tiers:
            choice = _Choice(tier, "pin:tier", f"tier {tier.value} requested")
        else:
            raise ModelNotAllowed(f"tenant {policy.tenant!r} may not use tier {tier.value!r}")
        return _tier_plan(
            choice,
            requested_model=requested_model,
            needed=needed,
            policy=policy,
            catalog=catalog,
            signals=signals,
        )
    spec = catalog.get(requested_model)
    if spec is None:
        raise UnknownModel(
            f"unknown model {requested_model!r}: use 'auto', a tier "
            f"({', '.join(t.value for t in Tier)}) or a deployment's model id"
        )
    return _model_plan(spec, needed, policy, signals)


def _tier_named(name: str) -> Tier | None:
    try:
        return Tier(name)
    except ValueError:
        return None


def _two_numbers(score: float, threshold: float) -> tuple[str, str]:
    """Score and threshold with 2 decimals, or more where 2 would make them look equal."""
    for digits in (2, 3, 4, 6):
        shown = f"{score:.{digits}f}", f"{threshold:.{digits}f}"
        if shown[0] != shown[1] or score == threshold:
            return shown
    return f"{score!r}", f"{threshold!r}"


def _auto_choice(
    features: PromptFeatures, policy: TenantPolicy, classifier: Classifier | None
) -> _Choice:
    default = policy.default_tier
    if classifier is None:
        return _Choice(default, "auto:default", f"no classifier → default tier {default.value}")
    try:
        score = float(classifier.score(features))
    except Exception as exc:  # noqa: BLE001 — fail open: any classifier error routes by default
        reason = f"classifier failed ({type(exc).__name__}) → default tier {default.value}"
        return _Choice(default, "classifier_failed", reason)
    if math.isnan(score) or not 0.0 <= score <= 1.0:
        reason = f"classifier returned {score!r}, not in [0, 1] → default tier {default.value}"
        return _Choice(default, "classifier_failed", reason)
    shown, limit = _two_numbers(score, policy.threshold)
    if score >= policy.threshold:
        reason = f"score {shown} ≥ threshold {limit} → large"
        return _Choice(Tier.LARGE, "auto:threshold", reason, score)
    reason = f"score {shown} < threshold {limit} → small"
    return _Choice(Tier.SMALL, "auto:threshold", reason, score)


def _allowed_chain(tier: Tier, policy: TenantPolicy) -> tuple[Tier, ...]:
    return tuple(t for t in FALLBACK_ORDER[tier] if t in policy.allowed_tiers)


def _tier_plan(
    choice: _Choice,
    *,
    requested_model: str,
    needed: int,
    policy: TenantPolicy,
    catalog: Catalog,
    signals: Signals,
) -> RoutePlan:
    tier = choice.tier
    chain = _allowed_chain(tier, policy)
    if not chain:
        raise ModelNotAllowed(f"tenant {policy.tenant!r} may use no tier")
    notes = [choice.reason]
    if chain[0] is not tier:
        notes.append(f"{tier.value} not allowed → {chain[0].value}")
    fitting = {t: tuple(d for d in catalog.of_tier(t) if d.max_model_len >= needed) for t in chain}
    usable = [t for t in chain if fitting[t]]
    if not usable:
        raise NoDeploymentFits(
            _no_fit_message(needed, [d for t in chain for d in catalog.of_tier(t)])
        )
    if usable[0] is not chain[0]:
        notes.append(_moved_note(chain[0], usable[0], needed, catalog))
    deployments = _available_first([d for t in usable for d in fitting[t]], signals)
    first = deployments[0]
    if first.tier is not usable[0]:
        notes.append(f"{usable[0].value} unavailable → {first.tier.value} first")
    return RoutePlan(
        tier=first.tier,
        deployments=tuple(d.model for d in deployments),
        rule=choice.rule,
        reason="; ".join(notes),
        score=choice.score,
        requested_model=requested_model,
    )


def _model_plan(
    spec: DeploymentSpec, needed: int, policy: TenantPolicy, signals: Signals
) -> RoutePlan:
    if spec.tier not in policy.allowed_tiers:
        raise ModelNotAllowed(
            f"tenant {policy.tenant!r} may not use {spec.model!r} (tier {spec.tier.value})"
        )
    if policy.allowed_models is not None and spec.model not in policy.allowed_models:
        raise ModelNotAllowed(f"tenant {policy.tenant!r} may not use {spec.model!r}")
    if spec.max_model_len < needed:
        raise NoDeploymentFits(_no_fit_message(needed, [spec]))
    reason = f"model {spec.model} requested"
    if spec.model in signals.unavailable:
        reason += " (currently unavailable)"
    return RoutePlan(
        tier=spec.tier,
        deployments=(spec.model,),
        rule="pin:model",
        reason=reason,
        requested_model=spec.model,
    )


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
