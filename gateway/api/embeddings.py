"""``POST /v1/embeddings``: the edge service (``gateway.api.edge.serve``) with the embeddings
front: admitted by ``gateway.api.embeddings_wire``, planned by ``router.embeddings`` onto one
embedding deployment, then limited, queued, run, billed (per input token) and booked as every
request is; the deployment's answer goes out as it came (OpenAI's shape)."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.api.access import AUTHENTICATED, access
from gateway.api.deps import ServicesDep
from gateway.api.edge import Intake, Prepared, observe_plan, serve
from gateway.api.embeddings_wire import EmbeddingRequest, admit_embedding
from gateway.api.error_docs import refusals
from gateway.api.openapi import request_openapi
from gateway.api.routing import request_priority_of, routing_error
from gateway.api.shapes import CHAT
from gateway.auth.principals import Principal
from router.embeddings import plan_embedding
from router.errors import RoutingError

__all__ = ["router"]

router = APIRouter(responses=refusals(400, 404, 409, 413, 422, 429, 502, 504))

_EXAMPLE = {"model": "auto", "input": ["The food was delicious.", "The service was slow."]}


async def embeddings_front(intake: Intake, raw: bytes) -> Prepared:
    services, request, tenant = intake.services, intake.request, intake.tenant
    admitted = admit_embedding(raw, dict(request.headers), services.settings.limits)
    intake.requested_model = admitted.request.model
    intake.clock.lap("parse")
    routed_at = time.perf_counter()
    deadline = intake.deadline(admitted.meta)  # never streamed
    try:
        plan = plan_embedding(
            admitted.request.model, services.policies[tenant], services.embeddings
        )
    except RoutingError as exc:
        raise routing_error(exc) from None
    intake.plan = plan
    spec = services.embeddings.get(plan.deployments[0])
    if spec is not None:
        admitted.check_fits(spec.model, spec.max_model_len)
    observe_plan(services, tenant, plan, time.perf_counter() - routed_at)
    intake.clock.lap("route")
    return Prepared(
        body=admitted.body,
        meta=admitted.meta,
        deadline=deadline.at,
        plan=plan,
        priority=request_priority_of(services, tenant, admitted.meta),
        conversation=None,
        shape=CHAT,  # the deployment's answer is already OpenAI's
        wants_usage=False,
        rate_tokens=admitted.estimated_tokens,
        prompt_bound=admitted.bound,
        output_limit=0,  # no output tokens
        prompt=admitted.body.get("input"),
    )


@router.post("/v1/embeddings", openapi_extra=request_openapi(EmbeddingRequest, _EXAMPLE))
async def embeddings(
    request: Request, services: ServicesDep, principal: Annotated[Principal, access(AUTHENTICATED)]
) -> Response:
    return await serve(request, services, principal, endpoint="embeddings", front=embeddings_front)
