"""The edge service: the one path every model endpoint takes, so handlers stay thin.

``route`` is the routing half (the tenant's rules and the request's context, the live signals
for its lane, the planner), shared by the handlers that run a request and by
``/v1/route/explain``, which only shows the plan. ``serve`` is the whole request: in-flight
limit, body, admission, ``route``, the job, rate limit and budget reservation, the queue, and
the relay of the answer, with the request's one ledger row for every refusal the edge gives
itself (a worker books the rest)::

    handler ─▶ serve: inflight ▸ read body ▸ admit ▸ route ▸ Job ▸ limits ▸ dispatcher.submit
                      ▸ first reply ▸ json_response / sse_response
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, NoReturn

from fastapi import Request
from fastapi.responses import Response
from redis.exceptions import RedisError

from gateway.accounting.bounds import prompt_token_bound
from gateway.api.admission import Admitted, admit, read_body
from gateway.api.booking import Refusal, book_refusal, observe_refusal, refusal_entry
from gateway.api.disconnect import first_unless_gone
from gateway.api.inflight import InflightRequests
from gateway.api.meta import RequestMeta
from gateway.api.relay import RelayContext, RelayedError, json_response, sse_response
from gateway.api.routing import live_signals, plan_request, request_priority
from gateway.api.shapes import CHAT, Shape
from gateway.api.stream_idle import idle_limited
from gateway.api.timeout import RequestDeadline
from gateway.api.timing import StageClock
from gateway.auth.directory import prompts_loggable
from gateway.auth.principals import Principal
from gateway.errors import ClientDisconnected, GatewayError, PermissionDenied
from gateway.observability.logging import bind_request_id, new_request_id
from gateway.parts import Services
from gateway.queue.jobs import Job
from gateway.queue.lanes import lane_of
from gateway.rules.edge import RuleInputs, capped_body, hold_conversation, rule_inputs
from gateway.settings import LimitsSettings
from router.catalog import Signals
from router.plan import RoutePlan
from router.rules import RuleSet

__all__ = [
    "Admit",
    "Front",
    "Intake",
    "Prepared",
    "Routed",
    "admit_chat",
    "chat_front",
    "observe_plan",
    "route",
    "serve",
]

log = logging.getLogger(__name__)

Admit = Callable[[bytes, dict[str, str], LimitsSettings], tuple[Admitted, Shape]]
"""From the raw body and the (lower-case) headers to the admitted chat request it runs as, and
the shape its answer takes for the client (``gateway.api.shapes``)."""


def admit_chat(
    raw: bytes, headers: dict[str, str], limits: LimitsSettings
) -> tuple[Admitted, Shape]:
    """``/v1/chat/completions``: the body is the chat request, the answer goes out as it is."""
    return admit(raw, headers, limits), CHAT


@dataclass(frozen=True, slots=True)
class Routed:
    """What routing made of a request: its plan, and what the plan was made on."""

    plan: RoutePlan
    inputs: RuleInputs
    signals: Signals
    priority: str
    """The request's priority before rules (its header, else its tenant's default)."""


async def route(
    services: Services,
    tenant: str,
    admitted: Admitted,
    *,
    time_left_s: float,
    rules: RuleSet | None = None,
) -> Routed:
    """The plan for ``admitted`` with ``time_left_s`` of its deadline left. ``rules``: plan
    under these (a draft, already followed by the global rules) instead of the tenant's
    running rules — the same inputs, signals and planner otherwise."""
    inputs = await rule_inputs(services.rules, tenant, admitted, time_left_s=time_left_s)
    if rules is not None:
        inputs = replace(inputs, rules=rules)
    priority = request_priority(services, tenant, admitted)
    signals = live_signals(services, tenant, lane_of(priority))
    plan = plan_request(services, tenant, admitted, inputs, signals=signals)
    return Routed(plan, inputs, signals, priority)


def observe_plan(services: Services, tenant: str, plan: RoutePlan, seconds: float) -> None:
    metrics = services.metrics
    metrics.route_time.labels(str(plan.score is not None).lower()).observe(seconds)
    metrics.route_decisions.labels(tenant, plan.tier.value, plan.rule).inc()
    if plan.score is not None:
        metrics.classifier_score.labels(tenant).observe(plan.score)
    services.tracing.routed(tenant, plan, seconds)


@dataclass(slots=True)
class Intake:
    """A request as far as the edge has read it: what its refusal's ledger row says (the
    endpoint's front fills ``requested_model``, ``stream`` and ``plan`` in as it learns them)."""

    request: Request
    services: Services
    tenant: str
    received_at: float
    clock: StageClock
    endpoint: str = "chat"
    requested_model: str = ""
    stream: bool = False
    plan: RoutePlan | None = None

    def deadline(self, meta: RequestMeta) -> RequestDeadline:
        """The request's deadline (``gateway.api.timeout``) from its admitted ``meta``; the
        front reads it once ``stream`` is known."""
        return RequestDeadline.of(
            meta,
            self.services.settings.queue,
            self.received_at,
            headers=self.request.headers,
            stream=self.stream,
        )


@dataclass(frozen=True, slots=True)
class Prepared:
    """What an endpoint's front made of a request: the job's parts, its limits and its answer."""

    body: dict[str, Any]
    """What the backend receives."""
    meta: RequestMeta
    deadline: float
    plan: RoutePlan
    priority: str
    conversation: str | None
    shape: Shape
    wants_usage: bool
    rate_tokens: int
    """What the rate limit counts: the estimated prompt and the output budget."""
    prompt_bound: int
    """The most prompt tokens (``gateway.accounting.bounds``): the budget reservation's."""
    output_limit: int | None
    """The output limit a budget reserves for (``None``: the deployment's context)."""
    choices: int = 1
    prompt: Any = None
    """What the access line may log of the prompt (when ``logging.log_prompts`` allows)."""


Front = Callable[[Intake, bytes], Awaitable[Prepared]]
"""An endpoint's front: from the raw body to the prepared request."""


def chat_front(parse: Admit = admit_chat) -> Front:
    """The front of every endpoint that runs as a chat request: ``parse`` admits the body as
    one, ``route`` plans it."""

    async def front(intake: Intake, raw: bytes) -> Prepared:
        services, request, tenant = intake.services, intake.request, intake.tenant
        admitted, shape = parse(raw, dict(request.headers), services.settings.limits)
        intake.requested_model = admitted.request.model
        intake.stream = admitted.request.stream
        intake.clock.lap("parse")
        routed_at = time.perf_counter()
        deadline = intake.deadline(admitted.meta)
        try:
            routed = await route(
                services, tenant, admitted, time_left_s=deadline.left_s(time.time())
            )
        except GatewayError as exc:  # a routing refusal names the field the client sent
            exc.param = shape.param(exc.param)
            raise
        plan = intake.plan = routed.plan
        await hold_conversation(services.rules, tenant, routed.inputs, plan)
        observe_plan(services, tenant, plan, time.perf_counter() - routed_at)
        intake.clock.lap("route")
        body = capped_body(admitted.body, plan)
        return Prepared(
            body=body,
            meta=admitted.meta,
            deadline=deadline.at,
            plan=plan,
            priority=plan.priority or routed.priority,
            conversation=routed.inputs.context.conversation,
            shape=shape,
            wants_usage=admitted.request.wants_usage,
            rate_tokens=admitted.features.estimated_prompt_tokens + admitted.output_budget,
            prompt_bound=prompt_token_bound(body),
            output_limit=admitted.request.output_limit,
            choices=admitted.choices,
            prompt=admitted.body.get("messages"),
        )

    return front


async def serve(
    request: Request,
    services: Services,
    principal: Principal,
    *,
    parse: Admit = admit_chat,
    endpoint: str = "chat",
    front: Front | None = None,
) -> Response:
    """Run one model request end to end (module docstring). ``front`` reads and plans it
    (default: as a chat request whose body ``parse`` admits); ``endpoint`` names the API on
    its ledger row."""
    started = time.perf_counter()
    clock = StageClock(started, auth_s=getattr(request.state, "auth_s", 0.0))
    received_at = time.time()
    request_id = new_request_id()
    request.state.request_id = request_id
    bind_request_id(request_id)
    intake = Intake(request, services, principal.tenant or "", received_at, clock, endpoint)
    try:
        tenant = principal.tenant
        if tenant is None or tenant not in services.policies:
            raise PermissionDenied(f"principal {principal.name!r} cannot call models")
        inflight: InflightRequests = request.app.state.inflight
        inflight.admit(services.settings.limits.max_inflight_requests)  # before the body
        raw = await read_body(request, services.settings.limits.max_body_bytes)
        prepared = await (front or chat_front(parse))(intake, raw)
        plan, stream = prepared.plan, intake.stream
        job = Job(
            request_id=request_id,
            tenant=tenant,
            principal=principal.name,
            reply_to=services.edge_id,
            plan=plan,
            body=prepared.body,
            stream=stream,
            enqueued_at=time.time(),
            deadline=prepared.deadline,
            received_at=received_at,
            app=prepared.meta.app,
            tags=prepared.meta.tags,
            priority=prepared.priority,
            idempotency_key=prepared.meta.idempotency_key,
            conversation=prepared.conversation,
            traceparent=services.tracing.traceparent(),
            endpoint=endpoint,
        )
        await services.rate_limits.admit(tenant, tokens=prepared.rate_tokens)
        await services.budgets.reserve_job(  # worst case (every choice); settled when booked
            job, prepared.prompt_bound, prepared.output_limit, choices=prepared.choices
        )
        clock.lap("limits")
        replies = await services.dispatcher.submit(job)
        first = await first_unless_gone(request, replies)
        if first is None:
            await _abandoned(services, job)
        if first.meta.replayed:
            await _settle_repeat(services, job)
        clock.lap("wait")
        ctx = RelayContext(
            services=services,
            request_id=request_id,
            started=started,
            rule=plan.rule,
            wants_usage=prepared.wants_usage,
            tenant=tenant,
            planned=plan.first_choice,  # a fallback from it is counted, a drained tier's too
            prompt=prepared.prompt
            if prompts_loggable(services.settings, services.policies, tenant)
            else None,
            clock=clock,
            shape=prepared.shape,
            dropped=plan.dropped_for,
        )
        if stream:
            idle_s = services.settings.limits.sse_idle_s

            async def book_unrun() -> None:  # its client left; its job found never run
                gone = ClientDisconnected("the client closed the connection before the answer")
                await _book(services, principal, intake, request_id, gone)

            return await sse_response(
                ctx,
                first,
                idle_limited(replies, idle_s),
                on_gone=lambda: services.dispatcher.abandon_soon(job, book_unrun),
            )
        return json_response(ctx, first)
    except RelayedError as relayed:
        raise relayed.error from None
    except GatewayError as error:
        await _book(services, principal, intake, request_id, error)
        raise


async def _settle_repeat(services: Services, job: Job) -> None:
    """A repeat answered with its first request's reply runs nothing and is booked nowhere:
    its budget reservation is settled at no cost now (if Redis fails here, the sweep releases
    it later, ``gateway.accounting.sweep``)."""
    try:
        await services.budgets.settle_unbooked(job)
    except (RedisError, OSError) as exc:
        log.warning("cannot settle the repeat %s: %s", job.request_id, type(exc).__name__)


async def _abandoned(services: Services, job: Job) -> NoReturn:
    """The client went away while its job waited or ran: stop the job; a job that never
    started is booked here (raising makes the handler book it), a started one by its worker,
    one handed back with its calls noted by the dispatcher, from the note."""
    gone = ClientDisconnected("the client closed the connection before the answer")
    if await services.dispatcher.abandon(job):
        raise gone
    # Booked by its owner; counted and logged here, as every request the edge answers.
    entry = refusal_entry(Refusal.of_job(job, gone), tenant=job.tenant, principal=job.principal)
    observe_refusal(services, entry, gone, requested_model=entry.requested_model)
    raise RelayedError(gone)


async def _book(
    services: Services, principal: Principal, intake: Intake, request_id: str, error: GatewayError
) -> None:
    refused = Refusal(
        request_id=request_id,
        received_at=intake.received_at,
        error=error,
        requested_model=intake.requested_model,
        plan=intake.plan,
        stream=intake.stream,
        endpoint=intake.endpoint,
    )
    await book_refusal(services, principal, refused)
