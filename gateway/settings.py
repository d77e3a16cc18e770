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
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from gateway.auth.principals import check_roles
from gateway.safe_text import MAX_NAME_CHARS, name_problem, no_control
from router.aliases import alias_problem
from router.capabilities import DEFAULT_CAPABILITIES, Capability
from router.catalog import Tier

__all__ = [
    "BreakerSettings",
    "BudgetSettings",
    "CapabilitySettings",
    "DatabaseSettings",
    "DeploymentSettings",
    "DiscoverySettings",
    "FallbackSettings",
    "KubernetesSettings",
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
    head_timeout_s: float = Field(default=10.0, gt=0, le=300)
    """A request's line and headers must arrive within this from its first byte; else 408
    ``request_timeout`` and the connection is closed. A new connection that sends nothing is
    closed after ``keep_alive_s``. Public and admin ports (``gateway.api.http_limits``)."""
    body_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    """A request's whole body must arrive within this after its headers; else 408
    ``request_timeout`` (or, once an answer has started, a closed connection)."""
    drain_s: float = Field(default=130.0, ge=0, le=3600)
    """After SIGTERM the edge accepts no new connection and lets the requests it holds finish
    for this long; then each one still waiting is answered 503 ``shutting_down`` (a stream
    that had started ends with an error event) and booked so (docs/deploy.md, "Drain budget
    per cloud"). The default covers a request's default deadline (120 s) and the grace a
    started job gets (5 s), and fits the manifests' grace period: preStop 10 s + 130 s + 10 s
    to answer and close = ``terminationGracePeriodSeconds: 150``."""


class RedisSettings(_Strict):
    url: str | None = None
    """``None``: start an embedded Redis (local ``redis-server`` binary). In ``cluster`` mode,
    any one node of the cluster (the others are discovered); in ``sentinel`` mode, the
    master's credentials, database and TLS (``rediss://``); its host is not used."""
    mode: Literal["standalone", "cluster", "sentinel"] = "standalone"
    """``cluster``: a Redis Cluster (every key is hash-tagged, so each script and multi-key
    command stays in one slot); ``sentinel``: the master the ``sentinels`` name for
    ``sentinel_master``, found again after a failover (docs/deploy.md, "Redis Cluster and
    Sentinel")."""
    sentinels: list[str] = Field(default_factory=list)
    """``host:port`` of each Sentinel (``sentinel`` mode)."""
    sentinel_master: str = "mymaster"

    @model_validator(mode="after")
    def _topology(self) -> RedisSettings:
        if self.mode == "cluster" and self.url is None:
            raise ValueError("redis.mode cluster needs redis.url (a node of the cluster)")
        if self.mode == "sentinel" and not self.sentinels:
            raise ValueError("redis.mode sentinel needs redis.sentinels (host:port each)")
        return self

    embedded_dir: Path = Path("var/redis")
    """The embedded Redis's data directory (its append-only file): kept across restarts, so
    what it held is there again; one server per directory."""
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


class CapabilitySettings(_Strict):
    """What a deployment can serve besides text (``router.capabilities``, docs/rules.md
    "Capabilities"). A request that needs one it lacks is never routed to it."""

    vision: bool = Capability.VISION in DEFAULT_CAPABILITIES
    """Image parts (``image_url``) in messages. Off: Llama 3.1 is text only."""
    tools: bool = Capability.TOOLS in DEFAULT_CAPABILITIES
    """``tools`` / ``tool_choice`` (vLLM: ``--enable-auto-tool-choice`` and a tool parser)."""
    json_schema: bool = Capability.JSON_SCHEMA in DEFAULT_CAPABILITIES
    """``response_format: json_schema`` (vLLM: guided decoding, on by default)."""
    reasoning: bool = Capability.REASONING in DEFAULT_CAPABILITIES
    """Reasoning parameters (``reasoning_effort``, ``reasoning``, ``thinking``)."""

    def of(self) -> frozenset[Capability]:
        """The capabilities that are on, as the router's catalog holds them."""
        on = {
            Capability.VISION: self.vision,
            Capability.TOOLS: self.tools,
            Capability.JSON_SCHEMA: self.json_schema,
            Capability.REASONING: self.reasoning,
        }
        return frozenset(c for c, yes in on.items() if yes)


class DiscoverySettings(_Strict):
    """A vLLM pool whose pods are found at run time, each ready pod one replica
    (docs/deploy.md, "Per-pod routing")."""

    mode: Literal["endpointslices", "dns"] = "endpointslices"
    """``endpointslices``: list and watch the Service's EndpointSlices through the Kubernetes
    API (pods that join or leave are seen at once, readiness included; needs a Role allowing
    ``list`` and ``watch`` of ``endpointslices``). ``dns``: resolve a headless Service's name
    every ``dns_interval_s`` (no API access; only ready pods are published in DNS)."""
    service: str = Field(min_length=1, max_length=253)
    """The Service's name (``endpointslices``), or the host name a headless Service answers
    to (``dns``, e.g. ``vllm-llama-8b-pods``)."""
    namespace: str | None = None
    """``endpointslices``: the Service's namespace; ``None``: the pod's own."""
    port: int | str = "http"
    """The pods' port: a number, or (``endpointslices``) the Service port's name."""
    max_num_seqs: int = Field(default=16, ge=1)
    """Slots per pod (vLLM ``--max-num-seqs``)."""
    scheme: Literal["http", "https"] = "http"
    dns_interval_s: float = Field(default=2.0, gt=0, le=60)

    @model_validator(mode="after")
    def _dns_port_is_a_number(self) -> DiscoverySettings:
        if self.mode == "dns" and not isinstance(self.port, int):
            raise ValueError(f"discovery of {self.service!r} by dns needs a port number")
        return self


class KubernetesSettings(_Strict):
    """How discovery by ``endpointslices`` reaches the Kubernetes API: by default as the pod's
    ServiceAccount (the token and CA Kubernetes mounts in every pod that asks for them)."""

    api_url: str = "https://kubernetes.default.svc"
    token_file: Path | None = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
    """Re-read at every (re)connection: projected tokens rotate. ``None``: no token."""
    ca_file: Path | None = Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
    """The API server's CA (``None``: the system's; ignored for ``http://``)."""
    namespace_file: Path = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    """Where the pod's own namespace is read, for discoveries that name none."""
    retry_max_s: float = Field(default=5.0, gt=0)
    """Longest pause between attempts to reach the API server after a failure."""
    pod_slots: dict[str, int] = Field(default_factory=dict)
    """Slots per pod by discovered Service name, over its deployment's
    ``discovery.max_num_seqs``: for a serving switch that changes the pods' ``--max-num-seqs``
    (``TIERGATE_KUBERNETES__POD_SLOTS='{"vllm-llama-8b": 64}'``)."""


class DeploymentSettings(_Strict):
    model: str
    """Model id clients may ask for, and the id sent to the backend
    (vLLM ``--served-model-name``)."""
    tier: Tier
    provider: Literal["vllm", "litellm"] = "vllm"
    kind: Literal["chat", "embedding"] = "chat"
    """``embedding``: serves ``/v1/embeddings`` only (vLLM ``--task embed``), never a chat
    request; priced per input token (docs/costs.md)."""
    max_model_len: int = Field(default=8192, ge=1)
    capabilities: CapabilitySettings = CapabilitySettings()
    """What it can serve besides text; unset: tools and JSON schemas, no images, no reasoning."""
    replicas: tuple[ReplicaSettings, ...] = ()
    """vLLM replicas. For ``litellm`` deployments, one replica's URL is the ``api_base``
    (optional)."""
    discovery: DiscoverySettings | None = None
    """vLLM only, instead of ``replicas``: the pool's pods, found at run time."""
    litellm_model: str | None = None
    """litellm's model string (e.g. ``openai/gpt-4o-mini``); defaults to ``model``."""
    api_key_env: str | None = None
    """Environment variable holding the provider's API key (never the key itself)."""
    price: PriceSettings | None = None
    """Explicit price; ``None`` takes litellm's cost map for external models. With
    ``gpu_hourly_usd`` it is the price used while the pool has no measured throughput."""
    gpu_hourly_usd: Decimal | None = Field(default=None, gt=0)
    """Self-hosted: what one GPU costs per hour; the per-token rate is fixed per pricing period
    from the pool's recorded cost and tokens (docs/costs.md, "Self-hosted pools")."""
    gpus_per_replica: int = Field(default=1, ge=1)
    gpu_rate_period_s: int = Field(default=86_400, ge=60)
    """GPU pricing period: one rate for every request received in it (default a UTC day)."""
    gpu_expected_tokens_per_s: float | None = Field(default=None, gt=0)
    """The pool's planned throughput: the rate while no measured period exists."""
    gpu_rate_min_per_mtok: Decimal | None = Field(default=None, ge=0)
    gpu_rate_max_per_mtok: Decimal | None = Field(default=None, gt=0)
    """Bounds of the measured rate (USD per million tokens)."""
    timeout_s: float = Field(default=120.0, gt=0)
    accepts_continuation: bool | None = None
    """Whether this deployment continues an assistant message it is given (vLLM's
    ``continue_final_message``), so a stream that broke elsewhere can go on here;
    ``None``: ``vllm`` deployments do, hosted APIs do not. Set it ``false`` for a server that
    refuses an assistant prefill (docs/fallback.md, "Streams")."""
    fallbacks: tuple[str, ...] = ()
    """The deployments to try, in order, when this one fails and the request named it (its
    model id, an alias to it, or a rule's ``deployment`` action); empty: none. Not followed
    transitively (docs/fallback.md, "Fallback chains")."""

    @model_validator(mode="after")
    def _vllm_needs_replicas(self) -> DeploymentSettings:
        if self.discovery is not None and (self.provider != "vllm" or self.replicas):
            raise ValueError(
                f"deployment {self.model!r}: discovery is for vllm deployments, without replicas"
            )
        if self.provider == "vllm" and not self.replicas and self.discovery is None:
            raise ValueError(
                f"deployment {self.model!r}: a vllm deployment needs replicas or discovery"
            )
        if self.kind == "embedding" and self.provider != "vllm":
            raise ValueError(
                f"deployment {self.model!r}: an embedding deployment is served by vllm"
            )
        return self


class PrincipalSettings(_Strict):
    """A key holder that is not a tenant: ``admin``, ``finance``, ``rules:<tenant>``."""

    name: Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS), AfterValidator(no_control)]
    roles: tuple[str, ...]
    """Well formed, naming one tenant at most (``gateway.auth.principals.check_roles``)."""
    key_env: str
    dev_key: str | None = None

    @field_validator("roles")
    @classmethod
    def _roles(cls, roles: tuple[str, ...]) -> tuple[str, ...]:
        problem = check_roles(roles, tenant_name=_config_tenant_name)
        if problem is not None:
            raise ValueError(problem)
        return roles


def _config_tenant_name(name: str) -> bool:
    return 0 < len(name) <= MAX_NAME_CHARS and name_problem(name, MAX_NAME_CHARS) is None


class BudgetSettings(_Strict):
    """A spending limit of one tenant, or of one of its apps or tags (docs/costs.md)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    limit_usd: Decimal = Field(gt=0)
    window: str = Field(default="month", pattern=r"^(month|[1-9][0-9]*d)$")
    """``month`` (UTC calendar month) or ``<N>d`` (N-day windows counted from 1970-01-01)."""
    mode: Literal["hard", "soft"] = "hard"
    """``hard`` refuses requests that could overshoot (429 ``budget_exceeded``); ``soft`` only
    alerts."""
    app: Annotated[str, AfterValidator(no_control)] | None = None
    tag: Annotated[str, AfterValidator(no_control)] | None = None
    alert_at: tuple[float, ...] = (0.5, 0.8, 1.0)
    """Fractions of the limit at which ``tiergate_budget_alert`` turns on and the webhook is
    called (once per threshold and window)."""
    webhook_url_env: str | None = None
    """Environment variable holding the URL to POST an alert to (Slack-compatible JSON; the URL
    of an incoming webhook is a secret, so it is never in the config itself)."""


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
    aliases: dict[str, str] = Field(default_factory=dict)
    """The tenant's model aliases, tried before the global ones (``Settings.aliases``)."""


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
    worker_drain_s: float = Field(default=140.0, ge=0, le=3600)
    """After SIGTERM a worker takes no new job and lets the running ones finish for this long
    (counted from the signal); what is still running then is handed back (claim released,
    calls noted) for another worker. The default fits the worker manifests'
    ``terminationGracePeriodSeconds: 150`` with 10 s to hand back and close."""


class LimitsSettings(_Strict):
    max_body_bytes: int = Field(default=2 * 1024 * 1024, ge=1024)
    max_messages: int = Field(default=512, ge=1)
    max_prompt_tokens: int = Field(default=200_000, ge=1)
    max_output_tokens: int = Field(default=32_768, ge=1)
    max_choices: int = Field(default=8, ge=1, le=128)
    """Most choices (``n``) one request may ask for; each is billed (docs/costs.md)."""
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
    max_model_chars: int = Field(default=256, ge=16)
    """Characters of ``model``; a longer one cannot name anything (400, not 404)."""
    max_user_chars: int = Field(default=256, ge=16)
    """Characters of the OpenAI ``user`` field."""
    max_app_chars: int = Field(default=128, ge=16)
    """Characters of ``x-tiergate-app`` (stored on every ledger row)."""
    max_tags: int = Field(default=16, ge=1)
    """Distinct tags of one request (``x-tiergate-tags``): each is a row of the daily rollup."""
    max_tag_chars: int = Field(default=64, ge=8)
    """Characters of one tag."""
    max_id_chars: int = Field(default=256, ge=16)
    """Characters of ``x-tiergate-conversation-id`` and ``idempotency-key``."""
    max_embedding_inputs: int = Field(default=2048, ge=1)
    """Inputs of one ``/v1/embeddings`` request (OpenAI's limit: 2048)."""
    max_embedding_input_tokens: int = Field(default=8192, ge=1)
    """Tokens of one embedding input (estimated for text, counted for token ids), at most the
    deployment's ``max_model_len`` too."""


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
    first_token_s: float = Field(default=8.0, gt=0)
    """Streams: until the first chunk (queueing and prefill included). Well under the common
    client read timeouts (10-15 s), so that a silent deployment is left while the client
    still waits; not applied when no other deployment is left to try."""
    first_byte_s: float = Field(default=30.0, gt=0)
    """Non-streamed calls: until the response's first byte (its status line). vLLM and hosted
    APIs send it with the whole answer, so it bounds a whole non-streamed answer; not applied
    when no other deployment is left to try."""
    stall_s: float = Field(default=10.0, gt=0)
    """Streams: the longest silence between two chunks; not applied when no other deployment
    is left to try."""
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
    replica_eject_after: int = Field(default=3, ge=0)
    """Backend-caused failures in a row after which a worker leaves a replica (a pod) of a
    deployment out (outlier ejection, per process); 0: never."""
    replica_eject_s: float = Field(default=10.0, gt=0)
    """An ejected replica's first cool-down before its trial call; doubled for each ejection
    in a row."""
    replica_eject_max_s: float = Field(default=300.0, gt=0)
    """The longest cool-down."""
    continuation: bool = True
    """Continue a stream that broke after its first token on the next deployment that accepts
    continuation (plain text only, never tool calls)."""
    attempt_share: float = Field(default=0.5, gt=0, le=1)
    """While other deployments are left to try, an attempt waits for its first token (a
    stream) or first byte (a non-streamed call) at most this share of the time left before
    the request's deadline, so the rest of the plan still has time when it stays silent."""

    def for_tier(self, tier: Tier) -> TierFaultSettings:
        return self.tiers.get(tier, TierFaultSettings())


class OwnShareSettings(_Strict):
    """Each tenant's own score distribution, for rules' ``target_large_share`` (docs/rules.md)."""

    refresh_s: float = Field(default=60.0, gt=0)
    """How often each process re-reads the tenants' recent scores from the ledger."""
    window_days: float = Field(default=7.0, gt=0)
    """How far back the scores go."""
    max_scores: int = Field(default=5000, ge=1)
    """The newest this many scored requests per tenant, at most."""
    min_scores: int = Field(default=200, ge=1)
    """Fewer than this: the documented mix's share curve is used instead."""


class RouterSettings(_Strict):
    model_path: Path | None = None
    """skops file of the complexity classifier; ``None``: the one shipped in ``router/models``."""
    own_share: OwnShareSettings = OwnShareSettings()


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
    kubernetes: KubernetesSettings = KubernetesSettings()
    deployments: tuple[DeploymentSettings, ...] = ()
    tenants: dict[str, TenantSettings] = Field(default_factory=dict)
    principals: tuple[PrincipalSettings, ...] = ()
    simulators: tuple[SimulatorSettings, ...] = ()
    aliases: dict[str, str] = Field(default_factory=dict)
    """Model aliases for every tenant: a model name applications send, or a pattern with ``*``
    (``gpt-4o*``), → ``auto``, a tier or a deployment id (docs/rules.md#model-aliases)."""

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

    @field_validator("tenants")
    @classmethod
    def _tenant_names(cls, tenants: dict[str, TenantSettings]) -> dict[str, TenantSettings]:
        for name in tenants:
            if not _config_tenant_name(name):
                raise ValueError(
                    f"tenant name {name[:40]!r}: 1-{MAX_NAME_CHARS} characters, no control "
                    "characters"
                )
        return tenants

    @model_validator(mode="after")
    def _references_exist(self) -> Settings:
        models = {d.model for d in self.deployments}
        names = models | {"auto", *(t.value for t in Tier)}
        for alias, target in self.aliases.items():
            if why := alias_problem(alias, target, reserved=names, targets=names):
                raise ValueError(why)
        for dep in self.deployments:
            if why := _chain_problem(dep, models):
                raise ValueError(why)
        for name, tenant in self.tenants.items():
            refs = [tenant.baseline_model, *(tenant.allowed_models or ())]
            for ref in refs:
                if ref is not None and ref not in models:
                    raise ValueError(f"tenant {name!r} names unknown deployment {ref!r}")
            baseline = self.deployment(tenant.baseline_model or "")
            if baseline is not None and baseline.kind != "chat":
                raise ValueError(f"tenant {name!r}: baseline_model must be a chat deployment")
            for alias, target in tenant.aliases.items():
                if why := alias_problem(alias, target, reserved=names, targets=names):
                    raise ValueError(f"tenant {name!r}: {why}")
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


def _chain_problem(dep: DeploymentSettings, models: set[str]) -> str | None:
    """What is wrong with ``dep``'s fallback chain (``None``: nothing)."""
    for fallback in dep.fallbacks:
        if fallback not in models or fallback == dep.model:
            return f"deployment {dep.model!r}: fallback {fallback!r} is not another deployment"
    if len(set(dep.fallbacks)) != len(dep.fallbacks):
        return f"deployment {dep.model!r}: a fallback is listed twice"
    return None


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
