"""``TenantDirectory``: the tenant policies the router reads, config-file tenants and run-time
tenants together. It is a read-only ``Mapping[str, TenantPolicy]`` (what ``Services.policies``
has always been) whose run-time part is replaced whenever ``RuntimeAuth`` reloads. A config-file
tenant wins over a run-time one of the same name (the admin API refuses to create one).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from gateway.auth.tenants import TenantProfile, TenantRecord
from gateway.settings import Settings
from router.catalog import TenantPolicy

__all__ = ["TenantDirectory", "policy_from_profile", "prompts_loggable", "tenant_priority"]


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
    def __init__(self, fixed: Mapping[str, TenantPolicy], default_threshold: float) -> None:
        self._fixed = dict(fixed)
        self._default_threshold = default_threshold
        self._runtime: dict[str, TenantPolicy] = {}
        self._profiles: dict[str, TenantProfile] = {}

    def replace(self, records: Mapping[str, TenantRecord]) -> None:
        """Swap in the run-time tenants (one assignment each, so readers never see a mix)."""
        runtime = {
            name: policy_from_profile(name, r.profile, self._default_threshold)
            for name, r in records.items()
            if name not in self._fixed
        }
        self._profiles = {name: r.profile for name, r in records.items()}
        self._runtime = runtime

    def is_configured(self, name: str) -> bool:
        return name in self._fixed

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
