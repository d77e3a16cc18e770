"""The one place where errors become HTTP responses (OpenAI-shaped bodies)."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from gateway.errors import (
    ClientDisconnected,
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    ServiceUnavailable,
)
from gateway.observability.logging import new_request_id
from gateway.observability.tracing import note_error

__all__ = ["error_response", "install_error_handlers", "raw_error_response"]

log = logging.getLogger(__name__)


def error_response(request: Request, error: GatewayError) -> JSONResponse:
    """Every refusal carries ``x-request-id``: the chat request's own (its ledger row's), else
    one made for it here (a 401 has no row, but its id is in the log and the client's report)."""
    request_id = getattr(request.state, "request_id", None)
    if not request_id:
        request_id = request.state.request_id = new_request_id()
    headers: dict[str, str] = {"x-request-id": request_id}
    if error.retry_after is not None:
        headers["retry-after"] = str(max(1, math.ceil(error.retry_after)))
    if error.retryable is not None:
        headers["x-should-retry"] = "true" if error.retryable else "false"
    if error.status == 401:
        headers["www-authenticate"] = "Bearer"
    note_error(error.code)
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def raw_error_response(error: GatewayError) -> bytes:
    """A whole HTTP/1.1 response (closing the connection), for refusals made in the protocol
    layer before there is a request to answer (``gateway.api.http_limits``)."""
    body = orjson.dumps(error.body())
    head = (
        f"HTTP/1.1 {error.status} {HTTPStatus(error.status).phrase}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


async def _gateway_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, GatewayError)
    cause = exc.__cause__
    if exc.status == 503 and cause is not None:
        # The body names only the kind of failure; what the infrastructure said (a Redis or
        # network error's message) is for the operator's log, not the client.
        log.warning("%s: %s (%s: %s)", request.url.path, exc.code, type(cause).__name__, cause)
    return error_response(request, exc)


_PARTS = frozenset({"body", "query", "path", "header", "cookie"})
"""Where FastAPI says a parameter was (the first element of an error's location)."""


def _invalid(error: Mapping[str, Any]) -> InvalidRequest:
    """A request that does not fit its route's schema, as one ``InvalidRequest``: the field's
    path in ``param`` (``budgets.0.limit_usd``), unknown fields called so."""
    loc = [str(p) for p in error.get("loc", ())]
    where = ".".join(loc)
    if error.get("type") == "json_invalid":
        at = f" at character {loc[1]}" if len(loc) > 1 else ""
        return InvalidRequest(f"request body is not valid JSON{at}", code="invalid_json")
    field = ".".join(loc[1:] if loc and loc[0] in _PARTS else loc) or None
    if error.get("type") == "extra_forbidden":
        return InvalidRequest(f"{where}: unknown field", param=field)
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    return InvalidRequest(f"{where}: {message}", param=field)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return error_response(request, _invalid(exc.errors()[0] if exc.errors() else {}))


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 404:
        return error_response(
            request, ModelNotFound(f"no route {request.url.path}", code="not_found")
        )
    error = GatewayError(str(exc.detail), code=f"http_{exc.status_code}")
    error.status = exc.status_code
    error.type = "invalid_request_error" if exc.status_code < 500 else "api_error"
    return error_response(request, error)


def _database_down(exc: Exception) -> bool:
    """The database cannot be reached or dropped the connection (as opposed to a bad query)."""
    if isinstance(exc, DBAPIError):
        return isinstance(exc, OperationalError | InterfaceError) or exc.connection_invalidated
    # SQLAlchemy passes a driver's failure to connect (refused, reset, timed out) through as is
    return isinstance(exc, DisconnectionError | PoolTimeoutError | ConnectionError | TimeoutError)


async def _database_error(request: Request, exc: Exception) -> JSONResponse:
    """A handler that reads or writes SQL (reports, rules, tenants and keys) while the database
    is down answers 503, as the README's error table says, not a 500."""
    if not _database_down(exc):
        return await _unexpected(request, exc)
    name = type(exc).__name__
    log.warning("%s: database unavailable (%s)", request.url.path, name)
    return error_response(request, ServiceUnavailable(f"the database is unavailable ({name})"))


async def _client_gone(request: Request, exc: Exception) -> JSONResponse:
    """The client went away (or was cut off by a read timeout, ``gateway.api.http_limits``)
    while its body was being read: nobody is left to answer, and nothing went wrong here."""
    return error_response(request, ClientDisconnected("the client went away before its body"))


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s", request.url.path, exc_info=exc)
    return error_response(request, GatewayError("internal error"))


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(GatewayError, _gateway_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(ClientDisconnect, _client_gone)
    for unavailable in (
        DBAPIError,
        DisconnectionError,
        PoolTimeoutError,
        ConnectionError,
        TimeoutError,
    ):
        app.add_exception_handler(unavailable, _database_error)
    app.add_exception_handler(Exception, _unexpected)
