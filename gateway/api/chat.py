"""``POST /v1/chat/completions``: authenticate ▸ admit ▸ route ▸ queue ▸ relay."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Annotated, NoReturn

from fastapi import APIRouter, Request
from fastapi.responses import Response
from redis.exceptions import RedisError

from gateway.api.admission import admit, read_body
from gateway.api.booking import book_refusal, observe_refusal, refusal_entry
from gateway.api.deps import ServicesDep
from gateway.api.disconnect import first_unless_gone
from gateway.api.error_docs import refusals
from gateway.api.inflight import InflightRequests
from gateway.api.openapi import chat_request_openapi
from gateway.api.relay import RelayContext, RelayedError, json_response, sse_response
from gateway.api.routing import live_signals, plan_request, request_priority
from gateway.api.stream_idle import idle_limited
from gateway.api.timeout import RequestDeadline
from gateway.api.timing import StageClock
from gateway.auth.access import AUTHENTICATED, access
from gateway.auth.directory import prompts_loggable
from gateway.auth.principals import Principal
from gateway.errors import ClientDisconnected, GatewayError, PermissionDenied
from gateway.observability.logging import bind_request_id
from gateway.queue.jobs import Job
from gateway.queue.lanes import lane_of
from gateway.rules.edge import capped_body, hold_conversation, rule_inputs
from gateway.services import Services
from router.plan import RoutePlan

__all__ = ["router"]

router = APIRouter(responses=refusals(400, 404, 409, 413, 429, 502, 504))
log = logging.getLogger(__name__)


def new_request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


def observe_plan(services: Services, tenant: str, plan: RoutePlan, seconds: float) -> None:
    metrics = services.metrics
    metrics.route_time.labels(str(plan.score is not None).lower()).observe(seconds)
    metrics.route_decisions.labels(tenant, plan.tier.value, plan.rule).inc()
    if plan.score is not None:
        metrics.classifier_score.labels(tenant).observe(plan.score)
    services.tracing.routed(tenant, plan, seconds)


@router.post("/v1/chat/completions", openapi_extra=chat_request_openapi())
async def chat_completions(
    request: Request, services: ServicesDep, principal: Annotated[Principal, access(AUTHENTICATED)]
) -> Response:
    started = time.perf_counter()
    clock = StageClock(started, auth_s=getattr(request.state, "auth_s", 0.0))
    received_at = time.time()
    request_id = new_request_id()
    request.state.request_id = request_id
    bind_request_id(request_id)
    requested_model = ""
    plan: RoutePlan | None = None
    stream = False
    try:
        tenant = principal.tenant
        if tenant is None or tenant not in services.policies:
            raise PermissionDenied(f"principal {principal.name!r} cannot call models")
        inflight: InflightRequests = request.app.state.inflight
        inflight.admit(services.settings.limits.max_inflight_requests)  # before the body
        raw = await read_body(request, services.settings.limits.max_body_bytes)
        admitted = admit(raw, dict(request.headers), services.settings.limits)
        requested_model = admitted.request.model
        stream = admitted.request.stream
        clock.lap("parse")
        routed_at = time.perf_counter()
        deadline = RequestDeadline.of(
            admitted.meta,
            services.settings.queue,
            received_at,
            headers=request.headers,
            stream=stream,
        )
        inputs = await rule_inputs(
            services.rules, tenant, admitted, time_left_s=deadline.left_s(time.time())
        )
        priority = request_priority(services, tenant, admitted)
        signals = live_signals(services, tenant, lane_of(priority))
        plan = plan_request(services, tenant, admitted, inputs, signals=signals)
        await hold_conversation(services.rules, tenant, inputs, plan)
        observe_plan(services, tenant, plan, time.perf_counter() - routed_at)
        clock.lap("route")
        job = Job(
            request_id=request_id,
            tenant=tenant,
            principal=principal.name,
            reply_to=services.edge_id,
            plan=plan,
            body=capped_body(admitted.body, plan),
            stream=stream,
            enqueued_at=time.time(),
            deadline=deadline.at,
            received_at=received_at,
            app=admitted.meta.app,
            tags=admitted.meta.tags,
            priority=plan.priority or priority,
            idempotency_key=admitted.meta.idempotency_key,
            conversation=inputs.context.conversation,
            traceparent=services.tracing.traceparent(),
        )
        if services.rate_limits is not None:
            await services.rate_limits.admit(
                tenant, tokens=admitted.features.estimated_prompt_tokens + admitted.max_tokens
            )
        if services.budgets is not None:  # worst case reserved; settled when booked
            await services.budgets.reserve_job(
                job, admitted.features.estimated_prompt_tokens, admitted.max_tokens
            )
        clock.lap("limits")
        replies = await services.dispatcher.submit(job)
        first = await first_unless_gone(request, replies)
        if first is None:
            await _abandoned(services, job)
        if services.budgets is not None and first.meta.get("replayed"):
            await _settle_repeat(services, job)
        clock.lap("wait")
        ctx = RelayContext(
            services,
            request_id=request_id,
            started=started,
            rule=plan.rule,
            wants_usage=admitted.request.wants_usage,
            tenant=tenant,
            planned=plan.deployments[0] if plan.deployments else None,
            prompt=admitted.body.get("messages")
            if prompts_loggable(services.settings, services.policies, tenant)
            else None,
            clock=clock,
        )
        if stream:
            idle_s = services.settings.limits.sse_idle_s

            async def book_unrun() -> None:  # its client left; its job found never run
                gone = ClientDisconnected("the client closed the connection before the answer")
                await _book(
                    services, request_id, principal, received_at, gone, requested_model, plan, True
                )

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
        await _book(
            services, request_id, principal, received_at, error, requested_model, plan, stream
        )
        raise


async def _settle_repeat(services: Services, job: Job) -> None:
    """A repeat answered with its first request's reply runs nothing and is booked nowhere:
    its budget reservation is settled at no cost now (if Redis fails here, the sweep releases
    it later, ``gateway.accounting.sweep``)."""
    assert services.budgets is not None
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
    entry = refusal_entry(
        request_id=job.request_id,
        tenant=job.tenant,
        principal=job.principal,
        received_at=job.received_at,
        error=gone,
        requested_model=str(job.body.get("model", "")),
        plan=job.plan,
        stream=job.stream,
    )
    observe_refusal(services, entry, gone, requested_model=entry.requested_model)
    raise RelayedError(gone)


async def _book(
    services: Services,
    request_id: str,
    principal: Principal,
    received_at: float,
    error: GatewayError,
    requested_model: str,
    plan: RoutePlan | None,
    stream: bool,
) -> None:
    await book_refusal(
        services,
        request_id=request_id,
        principal=principal,
        received_at=received_at,
        error=error,
        requested_model=requested_model,
        plan=plan,
        stream=stream,
    )
