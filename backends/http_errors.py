"""The one place where client exceptions and error responses become ``BackendError``\\s.

Error responses (any client), by HTTP status and body:

    408                                   BackendTimeout
    429                                   BackendRateLimited   (retry_after from Retry-After)
    5xx                                   BackendUnavailable   (retry_after from Retry-After)
    401, 403                              BackendNotConfigured (our key or account, not the request)
    other 4xx saying the context is full  ContextLengthExceeded
    other 4xx                             BackendRejected      (carrying the backend's message)
    anything else (1xx, 3xx)              BackendProtocolError

"The context is full" is OpenAI's code ``context_length_exceeded`` or vLLM's wording ("This
model's maximum context length is N tokens...", "... is longer than the maximum model length
of N"). vLLM error bodies come in two shapes and both are read: ``{"object": "error",
"message": ..., "type": ..., "code": 400}`` (older releases) and ``{"error": {"message": ...,
"type": ..., "param": ..., "code": 400}}`` (current, OpenAI-like). The status decides the class;
a body that is not JSON only loses the message (a proxy's HTML 502 is still ``Unavailable``).
The same bodies inside an SSE stream are read by ``error_from_payload``.

aiohttp exceptions (``error_from_aiohttp``):

    ConnectionTimeoutError, our own deadlines (TimeoutError)    BackendTimeout
    connect failures, resets, disconnects                       BackendConnectError, or
                                                                BackendStreamCut once a stream's
                                                                body has started
    ClientPayloadError (body cut off / malformed framing)      same as a reset
    InvalidURL                                                  BackendNotConfigured
    other ClientResponseError (unparseable response head)       BackendProtocolError

litellm exceptions (``error_from_litellm``) map by class first, then by ``status_code`` as
above: our deadline, ``Timeout`` or an httpx timeout → ``BackendTimeout``; ``APIConnectionError``
or a transport error anywhere in the cause chain (litellm reports a refused connection as a
500) → ``BackendConnectError`` / ``BackendStreamCut``; ``ContextWindowExceededError`` →
``ContextLengthExceeded``; ``MidStreamFallbackError`` is judged by the error it wraps. An
answer litellm could not read (``_unreadable_answer``: a body that is not JSON, or not a chat
completion, behind a 2xx; litellm reports it as a 500 of its own making, or, for a stream's
first event, as an ``APIConnectionError``) → ``BackendProtocolError`` with status 200: the
provider answered, and billed the call (docs/costs.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from types import ModuleType
from typing import Any

import aiohttp
import orjson

from backends.errors import (
    BackendConnectError,
    BackendError,
    BackendNotConfigured,
    BackendProtocolError,
    BackendRateLimited,
    BackendRejected,
    BackendStreamCut,
    BackendTimeout,
    BackendUnavailable,
    ContextLengthExceeded,
)

__all__ = [
    "error_from_aiohttp",
    "error_from_litellm",
    "error_from_payload",
    "error_from_response",
    "error_from_status",
    "is_context_length_error",
    "parse_retry_after",
]

_MAX_MESSAGE = 1000
_MAX_CODE = 64
_CONTEXT_RE = re.compile(
    r"maximum context length|maximum model length|context_length_exceeded|context window",
    re.IGNORECASE,
)
_UNREADABLE = (
    "Empty or invalid response from LLM endpoint",
    "Invalid response object",
    "Error in response object format",
    "Error in response creating model response object",
)
"""How litellm 1.82.6 says the answer behind a 2xx was not a chat completion (its own
exceptions, raised while converting the provider's body)."""


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; parsedate leaves "-0000" naive
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def is_context_length_error(message: str | None, code: object = None) -> bool:
    """Whether a 4xx means "prompt plus max_tokens do not fit the model's window"."""
    if code == "context_length_exceeded":
        return True
    return bool(message) and _CONTEXT_RE.search(message or "") is not None


def error_from_status(
    status: int,
    message: str,
    *,
    backend: str,
    code: object = None,
    retry_after: float | None = None,
) -> BackendError:
    """Classify an error by HTTP status (see the table in the module docstring)."""
    message = message[:_MAX_MESSAGE] or f"HTTP {status}"
    kw: dict[str, Any] = {"backend": backend, "status": status}
    if isinstance(code, str) and code and len(code) <= _MAX_CODE:  # vLLM's is the status
        kw["code"] = code
    if status == 429:
        return BackendRateLimited(message, retry_after=retry_after, **kw)
    if status >= 500:
        return BackendUnavailable(message, retry_after=retry_after, **kw)
    if status == 408:
        return BackendTimeout(message, **kw)
    if status in (401, 403):
        return BackendNotConfigured(message, **kw)
    if 400 <= status < 500:
        if is_context_length_error(message, code):
            return ContextLengthExceeded(message, **kw)
        return BackendRejected(message, **kw)
    return BackendProtocolError(f"unexpected HTTP status {status}: {message}", **kw)


def _fields(payload: object) -> tuple[str, object]:
    """``(message, code)`` from an error body in any of the shapes servers send."""
    if not isinstance(payload, Mapping):
        return "", None
    err = payload.get("error")
    if isinstance(err, Mapping):  # OpenAI, current vLLM
        return str(err.get("message") or err.get("type") or ""), err.get("code")
    if isinstance(err, str):  # {"error": "..."}
        return err, payload.get("code")
    if "message" in payload:  # older vLLM: {"object": "error", "message": ...}
        return str(payload.get("message") or ""), payload.get("code")
    detail = payload.get("detail")  # FastAPI's HTTPException / validation errors
    return (str(detail), None) if detail else ("", None)


def error_from_response(
    status: int, headers: Mapping[str, str], body: bytes, *, backend: str
) -> BackendError:
    """An HTTP response whose status is not 200."""
    try:
        message, code = _fields(orjson.loads(body))
    except orjson.JSONDecodeError:
        message, code = body[:_MAX_MESSAGE].decode("utf-8", "replace").strip(), None
    retry_after = parse_retry_after(headers.get("Retry-After"))
    return error_from_status(status, message, backend=backend, code=code, retry_after=retry_after)


def error_from_payload(payload: Mapping[str, Any], *, backend: str) -> BackendError | None:
    """The error an SSE event carries, or ``None`` when the event is not an error.

    vLLM reports failures after the 200 as a ``data:`` event in either error-body shape, with
    the HTTP status it would have used in ``code``; without one, it counts as a 500.
    """
    if "error" not in payload and payload.get("object") != "error":
        return None
    message, code = _fields(payload)
    status = code if isinstance(code, int) and 400 <= code < 600 else 500
    return error_from_status(status, message or "error event in stream", backend=backend, code=code)


def error_from_aiohttp(
    exc: Exception, *, backend: str, body_started: bool, waiting_for: str = "a response"
) -> BackendError:
    """An exception raised while calling aiohttp (or one of our deadlines expiring).

    ``body_started``: a streamed body had begun (a failure now cuts the stream).
    ``waiting_for``: what the call was waiting for, for the timeout message.
    """
    name = type(exc).__name__
    detail = str(exc) or name
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return BackendTimeout(f"connect timeout: {detail}", backend=backend)
    if isinstance(exc, TimeoutError):  # ours (asyncio.timeout_at) or aiohttp's socket timeouts
        return BackendTimeout(f"timed out waiting for {waiting_for}", backend=backend)
    if isinstance(exc, aiohttp.InvalidURL):
        return BackendNotConfigured(f"invalid backend URL: {detail}", backend=backend)
    if isinstance(exc, aiohttp.ClientConnectorError):  # nothing was sent
        return BackendConnectError(f"cannot connect: {detail}", backend=backend)
    if isinstance(exc, aiohttp.ClientConnectionError | aiohttp.ClientPayloadError | OSError):
        if body_started:
            return BackendStreamCut(f"stream cut: {name}: {detail}", backend=backend)
        return BackendConnectError(f"connection lost: {name}: {detail}", backend=backend)
    if isinstance(exc, aiohttp.ClientResponseError):  # its status is aiohttp's, not the server's
        return BackendProtocolError(f"bad response: {exc.message}", backend=backend)
    return BackendError(f"{name}: {detail}", backend=backend)


def _litellm_retry_after(exc: Exception) -> float | None:
    # litellm keeps the provider's headers in ``litellm_response_headers``; the ``response``
    # it attaches to its own exceptions is often a stand-in without them.
    response = getattr(exc, "response", None)
    for headers in (
        getattr(exc, "litellm_response_headers", None),
        getattr(response, "headers", None),
    ):
        if isinstance(headers, Mapping):
            seconds = parse_retry_after(headers.get("retry-after") or headers.get("Retry-After"))
            if seconds is not None:
                return seconds
    return None


def _transport_cause(exc: BaseException, httpx: ModuleType) -> BaseException | None:
    """The first transport error (httpx, aiohttp or the OS) in ``exc``'s cause chain, if any."""
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return None
        if isinstance(seen, httpx.TransportError | aiohttp.ClientConnectionError | OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _unreadable_answer(
    exc: BaseException, status_errors: tuple[type[BaseException], ...]
) -> str | None:
    """Why the answer behind ``exc`` could not be read, when the provider answered with a 2xx
    (litellm raised while reading its body); ``None`` for every other failure.

    The provider answered when no HTTP status error is in the cause chain (``status_errors``:
    the openai SDK's, which it raises for every status outside 2xx, and httpx's; not litellm's
    subclasses of them, which litellm also raises for its own failures), and the chain holds a
    JSON decoding error or litellm's own complaint about the body's shape. The reason is short:
    litellm's messages carry a traceback and the body itself, which may quote the answer.
    """
    seen: BaseException | None = exc
    reason: str | None = None
    for _ in range(10):
        if seen is None:
            break
        if isinstance(seen, status_errors) and not type(seen).__module__.startswith("litellm"):
            return None
        if isinstance(seen, json.JSONDecodeError):
            reason = reason or f"not JSON ({seen.msg} at character {seen.pos})"
        else:
            text = str(getattr(seen, "message", "") or seen)
            found = next((phrase for phrase in _UNREADABLE if phrase in text), None)
            if found is not None:
                reason = reason or f"not a chat completion ({found})"
        seen = seen.__cause__ or seen.__context__
    return reason


def _unreadable_error(exc: Exception, backend: str) -> BackendProtocolError | None:
    """The error for an answer behind a 2xx that litellm could not read, if ``exc`` is one."""
    import httpx
    import openai  # litellm's provider client: imported with it

    reason = _unreadable_answer(exc, (openai.APIStatusError, httpx.HTTPStatusError))
    if reason is None:
        return None
    return BackendProtocolError(
        f"the answer could not be read: {reason}", backend=backend, status=200
    )


def error_from_litellm(
    exc: Exception, *, backend: str, stream_started: bool, waiting_for: str = "a response"
) -> BackendError:
    """An exception raised by ``litellm.acompletion`` or its stream, or by our deadline.

    ``stream_started``: chunks were already delivered (a lost connection cuts the stream).
    Only ``LiteLLMBackend`` calls this, after it imported litellm; this module does not import
    litellm at import time (that takes seconds).
    """
    import httpx  # litellm's own client; raw httpx timeouts escape its stream wrapper
    from litellm import exceptions as litellm_errors  # imported already: a dict lookup

    if isinstance(exc, BackendError):
        return exc
    original = getattr(exc, "original_exception", None)  # MidStreamFallbackError wraps one
    if isinstance(exc, litellm_errors.MidStreamFallbackError) and isinstance(original, Exception):
        return error_from_litellm(
            original, backend=backend, stream_started=stream_started, waiting_for=waiting_for
        )
    message = str(getattr(exc, "message", "") or exc or type(exc).__name__)[:_MAX_MESSAGE]
    if isinstance(exc, TimeoutError):  # our asyncio deadline
        return BackendTimeout(f"timed out waiting for {waiting_for}", backend=backend)
    # litellm reports a refused connection as an InternalServerError (500): the transport
    # error underneath says what really happened.
    transport = _transport_cause(exc, httpx)
    if isinstance(exc, litellm_errors.Timeout) or isinstance(transport, httpx.TimeoutException):
        return BackendTimeout(message, backend=backend)
    if transport is not None:
        cls = BackendStreamCut if stream_started else BackendConnectError
        return cls(message, backend=backend)
    unreadable = None if stream_started else _unreadable_error(exc, backend)
    if unreadable is not None:  # a stream's later event that cannot be read cuts it (below)
        return unreadable
    if isinstance(exc, litellm_errors.APIConnectionError):
        if stream_started:
            return BackendStreamCut(message, backend=backend)
        # litellm also raises APIConnectionError when it cannot build or read a request (e.g.
        # a KeyError on a field it expected): with no transport error underneath, the request
        # is what failed. Retrying it elsewhere, and counting it against the provider's
        # breaker, would punish every tenant for one bad request.
        return BackendRejected(
            f"the provider client refused the request: {message}", backend=backend
        )
    if isinstance(exc, litellm_errors.ContextWindowExceededError):
        return ContextLengthExceeded(message, backend=backend, status=400)
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and status >= 400:
        code = getattr(exc, "code", None)
        retry_after = _litellm_retry_after(exc)
        return error_from_status(
            status, message, backend=backend, code=code, retry_after=retry_after
        )
    text = f"{type(exc).__name__}: {message}"[:_MAX_MESSAGE]
    if stream_started:
        return BackendStreamCut(text, backend=backend)
    return BackendError(text, backend=backend)
