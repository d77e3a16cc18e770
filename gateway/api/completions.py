"""``POST /v1/completions`` (legacy text completions) and ``POST /v1/responses`` (the
Responses API, stateless): the edge service (``gateway.api.edge.serve``) with their wire
(``gateway.api.completions_wire``, ``gateway.api.responses_wire``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.api.access import AUTHENTICATED, access
from gateway.api.admission import Admitted
from gateway.api.completions_wire import COMPLETION, CompletionRequest, admit_completion
from gateway.api.deps import ServicesDep
from gateway.api.edge import serve
from gateway.api.error_docs import refusals
from gateway.api.openapi import request_openapi
from gateway.api.responses_wire import ResponsesRequest, admit_response
from gateway.api.shapes import Shape
from gateway.auth.principals import Principal
from gateway.settings import LimitsSettings

__all__ = ["router"]

router = APIRouter(responses=refusals(400, 404, 409, 413, 422, 429, 502, 504))

_COMPLETION_EXAMPLE = {"model": "auto", "prompt": "Say hello.", "max_tokens": 32}
_RESPONSE_EXAMPLE = {"model": "auto", "input": "What is the capital of France?"}


def _completion(
    raw: bytes, headers: dict[str, str], limits: LimitsSettings
) -> tuple[Admitted, Shape]:
    return admit_completion(raw, headers, limits), COMPLETION


@router.post(
    "/v1/completions", openapi_extra=request_openapi(CompletionRequest, _COMPLETION_EXAMPLE)
)
async def completions(
    request: Request, services: ServicesDep, principal: Annotated[Principal, access(AUTHENTICATED)]
) -> Response:
    return await serve(request, services, principal, parse=_completion, endpoint="completions")


@router.post("/v1/responses", openapi_extra=request_openapi(ResponsesRequest, _RESPONSE_EXAMPLE))
async def responses(
    request: Request, services: ServicesDep, principal: Annotated[Principal, access(AUTHENTICATED)]
) -> Response:
    return await serve(request, services, principal, parse=admit_response, endpoint="responses")
