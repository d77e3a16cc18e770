"""The gateway's error tree. Each error knows its OpenAI-style ``type`` and ``code`` and its HTTP
status; ``gateway.api.errors`` is the one place that turns them (and router / backend errors)
into responses.

    GatewayError
    ├── InvalidRequest          400 invalid_request_error  (malformed JSON, bad fields, n>1, …)
    │   └── ContextTooLong      400 context_length_exceeded
    ├── AuthenticationFailed    401 invalid_api_key
    ├── PermissionDenied        403 model_not_allowed / permission_denied
    ├── ModelNotFound           404 model_not_found
    │   └── NotFound            404 not_found (an admin object: tenant, key)
    ├── Conflict                409 conflict (it exists already; x-should-retry: false)
    │   └── IdempotencyKeyReused 409 idempotency_key_reused: it ran, its answer is gone
    ├── PayloadTooLarge         413 request_too_large
    ├── HeadersTooLarge         431 request_headers_too_large
    ├── RateLimited             429 rate_limit_exceeded / queue_full / deadline_unreachable
    │                               (with Retry-After)
    │   └── BudgetExceeded      429 budget_exceeded: a hard budget cannot cover the request
    │                               (x-should-retry: false)
    ├── UpstreamFailed          502 upstream_error: every deployment of the plan failed
    ├── ServiceUnavailable      503 service_unavailable: Redis or the database cannot be used
    └── DeadlineExceeded        504 timeout: the request could not finish before its deadline
        └── RunTimedOut         504 timeout: a job that had started gave no answer in time
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AuthenticationFailed",
    "BudgetExceeded",
    "ClientDisconnected",
    "Conflict",
    "ContextTooLong",
    "DeadlineExceeded",
    "GatewayError",
    "HeadersTooLarge",
    "IdempotencyKeyReused",
    "InvalidRequest",
    "ModelNotFound",
    "NotFound",
    "PayloadTooLarge",
    "PermissionDenied",
    "RateLimited",
    "RunTimedOut",
    "ServiceUnavailable",
    "UpstreamFailed",
]


class GatewayError(Exception):
    status: int = 500
    type: str = "server_error"
    code: str = "internal_error"
    retryable: bool | None = None
    """Whether sending the same request again soon can get another answer, told to the client
    as ``x-should-retry``: the official OpenAI SDKs obey it over their own rule, which retries
    every 408, 409, 429 and 5xx twice. ``None``: not said (the SDK's rule applies)."""

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

    @property
    def outcome(self) -> str:
        """The ledger's name for this failure."""
        return self.code


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class ContextTooLong(InvalidRequest):
    code = "context_length_exceeded"


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


class HeadersTooLarge(GatewayError):
    status = 431
    type = "invalid_request_error"
    code = "request_headers_too_large"


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


class UpstreamFailed(GatewayError):
    status = 502
    type = "api_error"
    code = "upstream_error"

    def __init__(self, message: str, *, attempts: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.attempts = attempts or []


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
