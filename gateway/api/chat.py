"""``POST /v1/chat/completions``: the edge service (``gateway.api.edge.serve``) as it is."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.api.access import AUTHENTICATED, access
from gateway.api.deps import ServicesDep
from gateway.api.edge import serve
from gateway.api.error_docs import refusals
from gateway.api.openapi import chat_request_openapi
from gateway.auth.principals import Principal

__all__ = ["router"]

router = APIRouter(responses=refusals(400, 404, 409, 413, 422, 429, 502, 504))


@router.post("/v1/chat/completions", openapi_extra=chat_request_openapi())
async def chat_completions(
    request: Request, services: ServicesDep, principal: Annotated[Principal, access(AUTHENTICATED)]
) -> Response:
    return await serve(request, services, principal)
