"""All of tiergate's configuration, in one typed object.

Sources, highest precedence first: keyword arguments, ``TIERGATE_*`` environment variables
(``__`` separates nesting levels, e.g. ``TIERGATE_REDIS__URL``), the YAML file. Unknown keys are
rejected at start-up so a typo fails loudly. Secrets are never written in YAML: the file names the
environment variable that holds each key.
"""

from __future__ import annotations

import os
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from router.catalog import Tier

__all__ = [
    "BreakerSettings",
    "BudgetSettings",
    "DatabaseSettings",
    "DeploymentSettings",
    "FallbackSettings",
    "LimitsSettings",
    "LoggingSettings",
    "PriceSettings",
    "PrincipalSettings",
    "QueueSettings",
    "RedisSettings",
    "ReplicaSettings",
    "RetrySettings",
    "RouterSettings",
    "RulesSettings",
    "ServerSettings",
    "Settings",
    "SimulatorSettings",
    "TenantSettings",
    "TierFaultSettings",
    "TimeoutSettings",
    "TracingSettings",
    "load_settings",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerSettings(_Strict):
    host: str = "127.0.0.1"
    port: int = 8080
    admin_host: str = "127.0.0.1"
    admin_port: int = 9464
    keep_alive_s: int = Field(default=75, ge=1)
    """How long an idle client connection is kept open. Longer than a load balancer's idle
    timeout (60 s on common ones), so the balancer, not tiergate, closes idle connections: a
    connection the server closes just as the balancer reuses it fails that request (502)."""


class RedisSettings(_Strict):
    url: str | None = None
    """``None``: start an embedded Redis (local ``redis-server`` binary)."""
    key_prefix: str = "tg"
    """Every key tiergate writes starts with ``{prefix}:`` (tests isolate themselves this way)."""
    command_timeout_s: float = Field(default=1.0, gt=0, le=30)
    """How long a request-path Redis command may take, from send to reply, before the request
    gets a 503: a lost Redis fails fast instead of hanging every request. Opening a new
    connection may take half of it (0.5 s by default). The waits include the event loop's
    turn, so a gateway run far past its CPU may see them."""


class DatabaseSettings(_Strict):
    url: str = "sqlite+aiosqlite:///var/tiergate.db"
    """SQLAlchemy async URL: ``sqlite+aiosqlite:///…`` or
    ``postgresql+asyncpg://…``."""


class PriceSettings(_Strict):
    """USD per million tokens."""

    input_per_mtok: Decimal
    output_per_mtok: Decimal


class ReplicaSettings(_Strict):
    url: str
    max_num_seqs: int = Field(default=16, ge=1)


class DeploymentSettings(_Strict):
    model: str
    """Model id clients may ask for, and the id sent to the backend
    (vLLM ``--served-model-name``)."""
    tier: Tier
    provider: Literal["vllm", "litellm"] = "vllm"
    max_model_len: int = Field(default=8192, ge=1)
    replicas: tuple[ReplicaSettings, ...] = ()
    """vLLM replicas. For ``litellm`` deployments, one replica's URL is the ``api_base``
    (optional)."""
    litellm_model: str | None = None
    """litellm's model string (e.g. ``openai/gpt-4o-mini``); defaults to ``model``."""
    api_key_env: str | None = None
    """Environment variable holding the provider's API key (never the key itself)."""
    price: PriceSettings | None = None
    """Explicit price; ``None`` takes litellm's cost map for external models. With
    ``gpu_hourly_usd`` it is the price used while the pool has no measured throughput."""
    gpu_hourly_usd: Decimal | None = Field(default=None, gt=0)
    """Self-hosted: what one GPU costs per hour; per-token price derived from the pool's
    measured throughput (docs/costs.md)."""
    gpus_per_replica: int = Field(default=1, ge=1)
    timeout_s: float = Field(default=120.0, gt=0)

    @model_validator(mode="after")
    def _vllm_needs_replicas(self) -> DeploymentSettings:
        if self.provider == "vllm" and not self.replicas:
            raise ValueError(f"deployment {self.model!r}: a vllm deployment needs replicas")
        return self


class PrincipalSettings(_Strict):
    """A key holder that is not a tenant: ``admin``, ``finance``, ``rules:<tenant>``."""

    name: str
    roles: tuple[str, ...]
    key_env: str
    dev_key: str | None = None


class BudgetSettings(_Strict):
    """A spending limit of one tenant, or of one of its apps or tags (docs/costs.md)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    limit_usd: Decimal = Field(gt=0)
    window: str = Field(default="month", pattern=r"^(month|[1-9][0-9]*d)$")
    """``month`` (UTC calendar month) or ``<N>d`` (N-day windows counted from 1970-01-01)."""
    mode: Literal["hard", "soft"] = "hard"
    """``hard`` refuses requests that could overshoot (429 ``budget_exceeded``); ``soft`` only
    alerts."""
    app: str | None = None
    tag: str | None = None
    alert_at: tuple[float, ...] = (0.5, 0.8, 1.0)
    """Fractions of the limit at which ``tiergate_budget_alert`` turns on."""


class TenantSettings(_Strict):
    key_env: str
    dev_key: str | None = None
    default_tier: Tier = Tier.SMALL
    allowed_tiers: tuple[Tier, ...] = (Tier.SMALL, Tier.LARGE, Tier.EXTERNAL)
    allowed_models: tuple[str, ...] | None = None
    threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    """Classifier score at or above which ``auto`` goes large; ``None``: the shipped model's
    calibrated default (recorded in its model card)."""
    baseline_model: str | None = None
    """Deployment whose prices define the ledger's baseline cost; default: the first large
    deployment."""
    budgets: tuple[BudgetSettings, ...] = ()
    priority: Literal["interactive", "standard", "batch"] = "standard"
    weight: float = Field(default=1.0, gt=0)
    """Fair share within a priority lane, relative to the other tenants there."""
    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)
    """Rate limits, global across gateway processes (prompt estimate + output budget count)."""
    log_prompts: bool = False
    """The tenant's opt-in to having its prompts in access log lines (the operator's
    ``logging.log_prompts`` must be on too); off: its text is never logged."""


class QueueSettings(_Strict):
    default_timeout_ms: int = Field(default=120_000, ge=100)
    max_timeout_ms: int = Field(default=600_000, ge=100)
    max_depth: int = Field(default=1000, ge=1)
    """Waiting jobs per tier beyond which new requests get 429."""
    result_ttl_s: int = Field(default=300, ge=1)
    tier_max_depth: dict[str, int] = Field(default_factory=dict)
    """Per-tier override of ``max_depth``."""
    batch_headroom: float = Field(default=0.1, ge=0.0, lt=1.0)
    """Share of a tier's slots that batch-lane work may not take (kept for interactive)."""
    slot_lease_s: float = Field(default=30.0, gt=1.0)
    """Lifetime of a replica slot lease; held ones are renewed, a dead process's expire."""
    workers_per_process: int = Field(default=1, ge=0)
    direct_start: bool = True
    """A job that would be taken at once, with a free slot, starts in the edge's own worker
    without waiting in a stream (docs/queue.md, "Direct start")."""
    affinity: bool = True
    """A conversation's turns go to its home replica while it has room, for vLLM's prefix cache
    (docs/queue.md, "Conversation affinity"); off: replicas by load alone."""
    deadline_admission: bool = True
    """Refuse at once (429 ``deadline_unreachable``) a request not expected to start before its
    deadline, instead of a 504 at the deadline (docs/queue.md, "Deadlines and backpressure")."""
    deadline_margin: float = Field(default=0.1, ge=0.0)
    """How far (a share of the time left to start) the expected wait must exceed it."""
    deadline_min_waiting: int = Field(default=16, ge=1)
    """Jobs ahead of a request below which it is never refused on the estimate."""


class LimitsSettings(_Strict):
    max_body_bytes: int = Field(default=2 * 1024 * 1024, ge=1024)
    max_messages: int = Field(default=512, ge=1)
    max_prompt_tokens: int = Field(default=200_000, ge=1)
    max_output_tokens: int = Field(default=32_768, ge=1)
    default_max_tokens: int = Field(default=512, ge=1)
    """Output budget assumed for context-fit checks and reservations when the client sets
    none."""
    max_content_parts: int = Field(default=256, ge=1)
    """Content parts (``[{"type": "text", …}, …]``) across all messages of one request."""
    max_prompt_chars: int = Field(default=1_000_000, ge=1)
    """Characters of message text (content, parts, names) across one request."""
    max_header_bytes: int = Field(default=16 * 1024, ge=1024)
    """Request line plus headers; more is refused with 431 before the app sees the request."""
    max_inflight_requests: int = Field(default=4096, ge=1)
    """Chat requests one process holds at once (waiting, running or streaming); one more is
    refused with 503 ``overloaded`` (``gateway.api.inflight``)."""
    sse_idle_s: float = Field(default=60.0, gt=0)
    """Longest silence between two chunks of a stream the edge relays; then it ends the stream
    with an error event."""


class RetrySettings(_Strict):
    """Retries on the same deployment before the fallback chain moves on (docs/fallback.md)."""

    max_attempts: int = Field(default=2, ge=1)
    """Calls per deployment, the first included."""
    backoff_initial_s: float = Field(default=0.1, ge=0)
    backoff_max_s: float = Field(default=2.0, ge=0)
    jitter_s: float = Field(default=0.1, ge=0)
    retry_after_cap_s: float = Field(default=5.0, ge=0)
    """A ``Retry-After`` longer than this moves on to the next deployment at once."""
    retry_on: tuple[str, ...] = ("rate_limited", "unavailable", "connect_error")
    """Backend error kinds retried on the same deployment; other retryable kinds move on."""


class TimeoutSettings(_Strict):
    """Per-attempt timeouts; the request's own deadline caps them all."""

    connect_s: float = Field(default=3.0, gt=0)
    first_token_s: float = Field(default=15.0, gt=0)
    """Streams: until the first chunk (queueing and prefill included)."""
    stall_s: float = Field(default=10.0, gt=0)
    """Streams: the longest silence between two chunks."""
    attempt_s: float = Field(default=60.0, gt=0)
    """One call, start to end."""


class TierFaultSettings(_Strict):
    retry: RetrySettings = RetrySettings()
    timeouts: TimeoutSettings = TimeoutSettings()


class BreakerSettings(_Strict):
    """Circuit breaker per deployment, shared through Redis."""

    enabled: bool = True
    window_s: float = Field(default=10.0, gt=0)
    min_calls: int = Field(default=4, ge=1)
    failure_ratio: float = Field(default=0.5, gt=0, le=1)
    open_s: float = Field(default=5.0, gt=0)
    """How long an open breaker skips the deployment before a half-open probe."""
    probe_timeout_s: float = Field(default=10.0, gt=0)
    closed_view_s: float = Field(default=0.25, ge=0, le=5)
    """How long a process trusts its last check that found a breaker closed (calls and
    successes skip Redis meanwhile; a breaker opened elsewhere is seen within this). 0: always
    ask Redis."""
    health_interval_s: float = Field(default=1.0, ge=0)
    """Workers check each vLLM replica's ``/health`` this often; a deployment whose replicas
    all fail is drained (breaker opened at once). 0 disables."""
    health_timeouts_to_drain: int = Field(default=2, ge=1)
    """Checks in a row in which no replica of a deployment is healthy and one did not answer
    in time before it is drained (replicas that answer unhealthy or refuse drain at once)."""


class FallbackSettings(_Strict):
    tiers: dict[Tier, TierFaultSettings] = Field(default_factory=dict)
    """Retry policy and timeouts per tier; a tier not named here gets the defaults."""
    breaker: BreakerSettings = BreakerSettings()
    continuation: bool = True
    """Continue a stream that broke after its first token on the next vLLM deployment (plain
    text only, never tool calls)."""

    def for_tier(self, tier: Tier) -> TierFaultSettings:
        return self.tiers.get(tier, TierFaultSettings())


class RouterSettings(_Strict):
    model_path: Path | None = None
    """skops file of the complexity classifier; ``None``: the one shipped in ``router/models``."""


class RulesSettings(_Strict):
    """Routing rules (docs/rules.md): hot reload and conversation stickiness."""

    poll_interval_s: float = Field(default=0.5, gt=0, le=60)
    """How often each process checks the rule versions in SQL (pub/sub is the fast path)."""
    sticky_ttl_s: int = Field(default=86_400, ge=1)
    """How long a conversation that went large stays large after its last turn."""


class LoggingSettings(_Strict):
    """Structured logs (docs/observability.md)."""

    format: Literal["json", "text"] = "json"
    level: Literal["debug", "info", "warning", "error"] = "info"
    log_prompts: bool = False
    """Put the request's messages in its access log line; off: no prompt text in any log."""


class TracingSettings(_Strict):
    """OpenTelemetry traces over OTLP/HTTP (docs/observability.md#traces); off by default."""

    enabled: bool = False
    endpoint: str | None = None
    """Base URL of the collector's OTLP/HTTP receiver (``http://otel-collector:4318``;
    ``/v1/traces`` is appended). ``None``: the standard ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
    or ``OTEL_EXPORTER_OTLP_ENDPOINT`` variables, else ``http://localhost:4318``."""
    service_name: str | None = None
    """``service.name`` of the spans; ``None``: ``OTEL_SERVICE_NAME``, else ``tiergate``."""
    sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    """Share of new traces recorded (parent-based: a request that arrives with a
    ``traceparent`` follows the caller's sampling decision, and a job its request's)."""
    headers_env: dict[str, str] = Field(default_factory=dict)
    """Exporter headers, each naming the environment variable that holds its value
    (``{"authorization": "TIERGATE_OTLP_AUTH"}``); never the value itself."""
    export_timeout_s: float = Field(default=10.0, gt=0)
    max_queue_size: int = Field(default=2048, ge=1)
    """Ended spans buffered for export; beyond it new ones are dropped (never blocks)."""


class SimulatorSettings(_Strict):
    """A simulator ``tiergate up`` starts (for development and the demo)."""

    profile: str
    port: int
    host: str = "127.0.0.1"
    time_scale: float = Field(default=1.0, ge=0.0)
    usage_log: Path | None = None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TIERGATE_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    server: ServerSettings = ServerSettings()
    redis: RedisSettings = RedisSettings()
    database: DatabaseSettings = DatabaseSettings()
    queue: QueueSettings = QueueSettings()
    limits: LimitsSettings = LimitsSettings()
    router: RouterSettings = RouterSettings()
    rules: RulesSettings = RulesSettings()
    logging: LoggingSettings = LoggingSettings()
    tracing: TracingSettings = TracingSettings()
    fallback: FallbackSettings = FallbackSettings()
    deployments: tuple[DeploymentSettings, ...] = ()
    tenants: dict[str, TenantSettings] = Field(default_factory=dict)
    principals: tuple[PrincipalSettings, ...] = ()
    simulators: tuple[SimulatorSettings, ...] = ()

    @field_validator("deployments")
    @classmethod
    def _unique_models(
        cls, deployments: tuple[DeploymentSettings, ...]
    ) -> tuple[DeploymentSettings, ...]:
        seen: set[str] = set()
        for dep in deployments:
            if dep.model in seen or dep.model in {t.value for t in Tier} or dep.model == "auto":
                raise ValueError(f"deployment model id {dep.model!r} is duplicated or reserved")
            seen.add(dep.model)
        return deployments

    @model_validator(mode="after")
    def _references_exist(self) -> Settings:
        models = {d.model for d in self.deployments}
        for name, tenant in self.tenants.items():
            refs = [tenant.baseline_model, *(tenant.allowed_models or ())]
            for ref in refs:
                if ref is not None and ref not in models:
                    raise ValueError(f"tenant {name!r} names unknown deployment {ref!r}")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Only init kwargs (the YAML file, passed by load_settings) and the environment.
        return (env_settings, init_settings)

    def deployment(self, model: str) -> DeploymentSettings | None:
        return next((d for d in self.deployments if d.model == model), None)


def load_settings(path: Path | str | None = None, **overrides: Any) -> Settings:
    """Read the YAML file (if any), then let ``TIERGATE_*`` variables and ``overrides`` win."""
    data: dict[str, Any] = {}
    if path is not None:
        text = Path(path).read_text(encoding="utf-8")
        loaded = yaml.safe_load(text) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path}: the top level must be a mapping")
        data = loaded
    data.update(overrides)
    return Settings(**data)


def read_secret(env_name: str) -> str | None:
    """The one place that reads key material from the environment."""
    value = os.environ.get(env_name)
    return value if value else None
