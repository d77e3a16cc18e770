"""The gateway's error tree. Each error knows its OpenAI-style ``type`` and ``code`` and its HTTP
status; ``gateway.api.errors`` is the one place that turns them (and router / backend errors)
into responses.

    GatewayError
    ├── InvalidRequest          400 invalid_request_error  (malformed JSON, bad fields, n>1, …)
    │   ├── ContextTooLong      400 context_length_exceeded
    │   └── UnsupportedCapability 400 unsupported_capability: no deployment the request may
    │                               use serves its images, tools, JSON schema or reasoning
    ├── AuthenticationFailed    401 invalid_api_key
    ├── PermissionDenied        403 model_not_allowed / permission_denied
    ├── ModelNotFound           404 model_not_found
    │   └── NotFound            404 not_found (an admin object: tenant, key)
    ├── Conflict                409 conflict (it exists already; x-should-retry: false)
    │   └── IdempotencyKeyReused 409 idempotency_key_reused: it ran, its answer is gone
    ├── IdempotencyKeyMismatch  422 idempotency_key_mismatch: the key's first request had
    │                               another body (x-should-retry: false)
    ├── PayloadTooLarge         413 request_too_large
    ├── HeadersTooLarge         431 request_headers_too_large
    ├── RequestTimeout          408 request_timeout: the head or body came too slowly
    ├── RateLimited             429 rate_limit_exceeded / queue_full / deadline_unreachable
    │                               (with Retry-After)
    │   ├── BudgetExceeded      429 budget_exceeded: a hard budget's spend leaves no room
    │   │                           (x-should-retry: false)
    │   └── BudgetBusy          429 budget_busy: room once in-flight requests settle
    │                               (Retry-After: 1, x-should-retry: true)
    ├── UpstreamFailed          502 upstream_error: every deployment of the plan failed
    ├── ServiceUnavailable      503 service_unavailable: Redis or the database cannot be used
    └── DeadlineExceeded        504 timeout: the request could not finish before its deadline
        └── RunTimedOut         504 timeout: a job that had started gave no answer in time
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

__all__ = [
    "RELAYED",
    "AuthenticationFailed",
    "BudgetBusy",
    "BudgetExceeded",
    "ClientDisconnected",
    "Conflict",
    "ContextTooLong",
    "DeadlineExceeded",
    "GatewayError",
    "HeadersTooLarge",
    "IdempotencyKeyMismatch",
    "IdempotencyKeyReused",
    "InvalidRequest",
    "ModelNotFound",
    "NotFound",
    "PayloadTooLarge",
    "PermissionDenied",
    "RateLimited",
    "RequestTimeout",
    "RunTimedOut",
    "ServiceUnavailable",
    "StreamCut",
    "UnsupportedCapability",
    "UpstreamFailed",
    "relayed_error",
]


class GatewayError(Exception):
    status: int = 500
    type: str = "server_error"
    code: str = "internal_error"
    retryable: bool | None = None
    """Whether sending the same request again soon can get another answer, told to the client
    as ``x-should-retry``: the official OpenAI SDKs obey it over their own rule, which retries
    every 408, 409, 429 and 5xx twice. ``None``: not said (the SDK's rule applies)."""
    provisional: bool = False
    """The edge answers this while a run may still book the request (it could not settle who
    owns it): its ledger row is provisional, and a run's entry replaces the row's bookkeeping
    while the row keeps this answer (``gateway.accounting.supersede``)."""

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.param = param
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def unsettled(self) -> GatewayError:
        """This answer, booked provisional (``provisional``)."""
        self.provisional = True
        return self

    booked_as: str | None = None
    """The ledger's name for this failure when it is not ``code``: a backend's own code passed
    on to the client (OpenAI's ``invalid_value``, …) stays out of the ledger's and the metrics'
    outcomes, which keep ``backend_rejected``."""

    @property
    def outcome(self) -> str:
        """The ledger's name for this failure."""
        return self.booked_as or self.code


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class ContextTooLong(InvalidRequest):
    code = "context_length_exceeded"


class UnsupportedCapability(InvalidRequest):
    """The request needs a capability (``router.capabilities``) that no deployment it may use
    has; ``param`` names the field that needs it. The same request meets the same config."""

    code = "unsupported_capability"
    retryable = False


class AuthenticationFailed(GatewayError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class PermissionDenied(GatewayError):
    status = 403
    type = "permission_error"
    code = "permission_denied"


class ModelNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class NotFound(ModelNotFound):
    code = "not_found"


class Conflict(GatewayError):
    status = 409
    type = "invalid_request_error"
    code = "conflict"
    retryable = False  # the same request meets the same state


class IdempotencyKeyReused(Conflict):
    """A request with this idempotency key ran, and its answer was lost with Redis: the repeat
    is refused rather than run (and billed) twice."""

    code = "idempotency_key_reused"


class IdempotencyKeyMismatch(GatewayError):
    """A request reused an idempotency key with a body other than the first request's (the
    IETF ``Idempotency-Key`` draft's 422): a client error, never a replay of another answer."""

    status = 422
    type = "invalid_request_error"
    code = "idempotency_key_mismatch"
    retryable = False


class HeadersTooLarge(GatewayError):
    status = 431
    type = "invalid_request_error"
    code = "request_headers_too_large"


class RequestTimeout(GatewayError):
    """The request's head or body did not arrive within its read timeout (a slow client)."""

    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class PayloadTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class RateLimited(GatewayError):
    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


class BudgetExceeded(RateLimited):
    code = "budget_exceeded"
    retryable = False  # a budget's window does not refill in the seconds a client retries in


class BudgetBusy(RateLimited):
    """A hard budget whose spend leaves room for the request, but whose reservations of
    requests in flight do not: it fits once they settle (seconds), so a retry is invited."""

    code = "budget_busy"
    retryable = True


class UpstreamFailed(GatewayError):
    status = 502
    type = "api_error"
    code = "upstream_error"

    def __init__(
        self,
        message: str,
        *,
        attempts: list[dict[str, Any]] | None = None,
        code: str | None = None,
        param: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, code=code, param=param, retry_after=retry_after)
        self.attempts = attempts or []


class StreamCut(UpstreamFailed):
    """A stream that had started (its client has its 200 and some chunks) and that the edge
    ends with an error event: what its ledger row says (``stream_error``, status 200, as a
    worker books a stream it cannot finish). Never an HTTP answer of its own."""

    status = 200
    code = "stream_error"


class ServiceUnavailable(GatewayError):
    status = 503
    type = "api_error"
    code = "service_unavailable"


class ClientDisconnected(GatewayError):
    """The client went away before its answer (nginx's 499: never sent, only booked)."""

    status = 499
    type = "invalid_request_error"
    code = "client_disconnected"


class DeadlineExceeded(GatewayError):
    status = 504
    type = "api_error"
    code = "timeout"


class RunTimedOut(DeadlineExceeded):
    """The deadline (and the edge's grace) passed while a worker had the job, or after a run
    handed it back with calls noted: the client gets the same 504, but a run may still book
    the request, so the edge's ledger row is provisional (``gateway.accounting.supersede``)."""

    provisional = True


RELAYED: Mapping[str, type[GatewayError]] = MappingProxyType(
    {
        # The first class of each status is the one an unknown failure with it becomes.
        "backend_rejected": InvalidRequest,  # the body's code is the backend's own
        "context_length_exceeded": ContextTooLong,
        "rate_limit_exceeded": RateLimited,
        "upstream_error": UpstreamFailed,
        "stream_error": StreamCut,
        "shutting_down": ServiceUnavailable,
        "client_disconnected": ClientDisconnected,
        "timeout": DeadlineExceeded,
    }
)
"""The failures a worker (or the edge's booking of a handed-back job) answers a request with,
by the ledger's name for each (``GatewayError.outcome``): the class ``relayed_error`` makes."""

_BY_STATUS: Mapping[int, type[GatewayError]] = MappingProxyType(
    {cls.status: cls for cls in reversed(tuple(RELAYED.values()))}
)


def relayed_error(
    body: Mapping[str, Any],
    *,
    status: int | None,
    outcome: str | None = None,
    retry_after: float | None = None,
) -> GatewayError:
    """The error whose ``body()`` is ``body``, answered with ``status`` (``None``: not said)
    and booked as ``outcome`` (``None``: its code), as ``RELAYED`` names it. A failure the
    table does not know, or one whose status is not its class's (a newer worker's), is the
    table's first class with that status, else an ``UpstreamFailed``; the code stays the
    body's."""
    said = body.get("error")
    fields: Mapping[str, Any] = said if isinstance(said, Mapping) else {}
    code = fields.get("code")
    code = code if isinstance(code, str) else None
    param = fields.get("param")
    name = outcome or code
    cls = RELAYED.get(name) if name is not None else None
    if cls is None or (status is not None and cls.status != status):
        cls = _BY_STATUS.get(status, UpstreamFailed) if status is not None else UpstreamFailed
    error = cls(
        str(fields.get("message", "upstream error")),
        code=code,
        param=None if param is None else str(param),
        retry_after=retry_after,
    )
    if outcome is not None:
        error.booked_as = outcome  # the ledger's name, not the backend's code
    return error
