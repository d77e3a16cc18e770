"""``TenantDirectory``: the tenant policies the router reads, config-file tenants and run-time
tenants together. It is a read-only ``Mapping[str, TenantPolicy]`` (what ``Services.policies``
has always been) whose run-time part is replaced whenever ``RuntimeAuth`` reloads. A config-file
tenant wins over a run-time one of the same name (the admin API refuses to create one).

It also holds every tenant's ``TenantTerms`` and hands out live views of them —
``weights`` (dispatcher and worker), ``rates`` (rate limiter), ``budgets`` (budget book) and
``baselines`` (executor) — each a ``Mapping`` that reads the current terms at lookup time, so a
reload reaches all of them at once and none keeps a copy taken at start.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

from gateway.auth.tenants import TenantProfile, TenantRecord
from gateway.auth.terms import TenantTerms, terms_from_profile
from gateway.limits.rate import TenantRates
from gateway.settings import BudgetSettings, Settings
from router.catalog import TenantPolicy

__all__ = [
    "TenantDirectory",
    "TermsView",
    "policy_from_profile",
    "prompts_loggable",
    "tenant_priority",
]

T = TypeVar("T")


def policy_from_profile(
    name: str, profile: TenantProfile, default_threshold: float
) -> TenantPolicy:
    return TenantPolicy(
        tenant=name,
        default_tier=profile.default_tier,
        allowed_tiers=frozenset(profile.allowed_tiers),
        threshold=default_threshold if profile.threshold is None else profile.threshold,
        allowed_models=None
        if profile.allowed_models is None
        else frozenset(profile.allowed_models),
    )


class TenantDirectory(Mapping[str, TenantPolicy]):
    def __init__(
        self,
        fixed: Mapping[str, TenantPolicy],
        default_threshold: float,
        *,
        fixed_terms: Mapping[str, TenantTerms] | None = None,
        default_baseline: str | None = None,
    ) -> None:
        """``fixed``, ``fixed_terms``: the config-file tenants'; ``default_baseline``: the
        baseline deployment of a run-time tenant that names none."""
        self._fixed = dict(fixed)
        self._fixed_terms = dict(fixed_terms or {})
        self._default_threshold = default_threshold
        self._default_baseline = default_baseline
        self._runtime: dict[str, TenantPolicy] = {}
        self._profiles: dict[str, TenantProfile] = {}
        self._terms: dict[str, TenantTerms] = dict(self._fixed_terms)
        self.weights: Mapping[str, float] = TermsView(self, _weight)
        self.rates: Mapping[str, TenantRates] = TermsView(self, _rates)
        self.budgets: Mapping[str, tuple[BudgetSettings, ...]] = TermsView(self, _budgets)
        self.baselines: Mapping[str, str | None] = TermsView(self, _baseline)

    def replace(self, records: Mapping[str, TenantRecord]) -> None:
        """Swap in the run-time tenants (one assignment each, so readers never see a mix)."""
        runtime = {
            name: policy_from_profile(name, r.profile, self._default_threshold)
            for name, r in records.items()
            if name not in self._fixed
        }
        terms = {
            name: terms_from_profile(r.profile, self._default_baseline)
            for name, r in records.items()
            if name not in self._fixed
        }
        self._profiles = {name: r.profile for name, r in records.items()}
        self._runtime = runtime
        self._terms = {**terms, **self._fixed_terms}

    def is_configured(self, name: str) -> bool:
        return name in self._fixed

    def terms(self, name: str) -> TenantTerms | None:
        """The tenant's weight, rate limits, budgets and baseline (config file first)."""
        return self._terms.get(name)

    def terms_names(self) -> Iterator[str]:
        return iter(self._terms)

    def terms_count(self) -> int:
        return len(self._terms)

    def profile(self, name: str) -> TenantProfile | None:
        return self._profiles.get(name)

    def priority(self, name: str) -> str | None:
        """A run-time tenant's priority (config-file tenants: see their settings)."""
        profile = self._profiles.get(name)
        return profile.priority if profile is not None else None

    def __getitem__(self, name: str) -> TenantPolicy:
        found = self._fixed.get(name)
        if found is None:
            found = self._runtime[name]
        return found

    def __iter__(self) -> Iterator[str]:
        yield from self._fixed
        yield from (n for n in self._runtime if n not in self._fixed)

    def __len__(self) -> int:
        return len(self._fixed) + sum(1 for n in self._runtime if n not in self._fixed)


class TermsView(Mapping[str, T]):
    """One field of every tenant's terms, read from the directory at each lookup."""

    __slots__ = ("_directory", "_pick")

    def __init__(self, directory: TenantDirectory, pick: Callable[[TenantTerms], T]) -> None:
        self._directory = directory
        self._pick = pick

    def __getitem__(self, name: str) -> T:
        terms = self._directory.terms(name)
        if terms is None:
            raise KeyError(name)
        return self._pick(terms)

    def __iter__(self) -> Iterator[str]:
        return self._directory.terms_names()

    def __len__(self) -> int:
        return self._directory.terms_count()


def _weight(terms: TenantTerms) -> float:
    return terms.weight


def _rates(terms: TenantTerms) -> TenantRates:
    return terms.rates


def _budgets(terms: TenantTerms) -> tuple[BudgetSettings, ...]:
    return terms.budgets


def _baseline(terms: TenantTerms) -> str | None:
    return terms.baseline_model


def tenant_priority(settings: Settings, policies: Mapping[str, TenantPolicy], tenant: str) -> str:
    """The tenant's default priority: its config-file setting, else its run-time profile's."""
    configured = settings.tenants.get(tenant)
    if configured is not None:
        return configured.priority
    if isinstance(policies, TenantDirectory):
        return policies.priority(tenant) or "standard"
    return "standard"


def prompts_loggable(settings: Settings, policies: Mapping[str, TenantPolicy], tenant: str) -> bool:
    """Prompt text may reach a log line only when the operator allows it
    (``logging.log_prompts``) and the tenant opted in (its ``log_prompts``)."""
    if not settings.logging.log_prompts:
        return False
    configured = settings.tenants.get(tenant)
    if configured is not None:
        return configured.log_prompts
    profile = policies.profile(tenant) if isinstance(policies, TenantDirectory) else None
    return profile is not None and profile.log_prompts
