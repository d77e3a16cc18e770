"""Errors raised by backends.

The HTTP client's exceptions are translated into this tree in exactly one place
(``backends.http_errors``); nothing above ``backends/`` sees an aiohttp or litellm exception.

    BackendError                    any failure talking to a model (``retryable`` says what to do)
    ├── BackendConnectError         could not connect / connection reset before a response   (retry)
    ├── BackendTimeout              connect, first-token, stall or total timeout             (retry)
    ├── BackendRateLimited          429; ``retry_after`` in seconds when the server said     (retry)
    ├── BackendUnavailable          5xx, including vLLM's 503 when its queue is full         (retry)
    ├── BackendProtocolError        a response we cannot parse                               (retry)
    ├── BackendStreamCut            the stream ended without a finish_reason or [DONE]       (retry)
    ├── BackendRejected             4xx other than 429: the request itself is bad         (no retry)
    │   └── ContextLengthExceeded   prompt + max_tokens over the deployment's max_model_len (next
    │                               deployment whose window fits)
    └── BackendNotConfigured        a provider cannot be used (e.g. missing API key)      (no retry)
"""

from __future__ import annotations

import re

__all__ = [
    "BackendConnectError",
    "BackendError",
    "BackendNotConfigured",
    "BackendProtocolError",
    "BackendRateLimited",
    "BackendRejected",
    "BackendStreamCut",
    "BackendTimeout",
    "BackendUnavailable",
    "ContextLengthExceeded",
]


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
"""NUL and lone surrogates: a backend's message is text from outside, and ends up in the ledger
(an attempt's ``error``), which PostgreSQL cannot store with either."""


class BackendError(Exception):
    """A failure calling a backend. ``status`` is the HTTP status the backend sent, if any;
    ``code`` the provider's own error code when it sent a string one
    (``context_length_exceeded``, ``content_policy_violation``); ``message`` has NUL and lone
    surrogates replaced with U+FFFD and, unlike ``str()``, does not name the backend (the
    replica, an internal name)."""

    retryable: bool = True
    kind: str = "backend_error"

    def __init__(
        self,
        message: str,
        *,
        backend: str = "",
        status: int | None = None,
        retry_after: float | None = None,
        code: str | None = None,
    ) -> None:
        message = _UNSTORABLE.sub("\ufffd", message)
        super().__init__(message)
        self.message = message
        self.backend = backend
        self.status = status
        self.retry_after = retry_after
        self.code = code

    def __str__(self) -> str:
        where = f"[{self.backend}] " if self.backend else ""
        status = f" (HTTP {self.status})" if self.status else ""
        return f"{where}{self.message}{status}"


class BackendConnectError(BackendError):
    kind = "connect_error"


class BackendTimeout(BackendError):
    kind = "timeout"


class BackendRateLimited(BackendError):
    kind = "rate_limited"


class BackendUnavailable(BackendError):
    kind = "unavailable"


class BackendProtocolError(BackendError):
    kind = "protocol_error"


class BackendStreamCut(BackendError):
    kind = "stream_cut"


class BackendRejected(BackendError):
    retryable = False
    kind = "rejected"


class ContextLengthExceeded(BackendRejected):
    kind = "context_length_exceeded"


class BackendNotConfigured(BackendError):
    retryable = False
    kind = "not_configured"
