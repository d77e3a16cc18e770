"""Fault injection, switchable at run time through ``/admin/faults``.

``POST /admin/faults`` replaces the whole fault set with the posted JSON object (so what ``GET``
shows is exactly what was last posted, normalised); ``DELETE`` clears it. Keys:

============================  ==============================================================
``error_status`` (int)        answer with this status (400-599) ...
``error_rate`` (0-1)          ... for this fraction of requests (default 1.0 = all)
``rate_limit`` (bool)         429 with ``Retry-After``
``overloaded`` (bool)         503 with ``Retry-After`` (vLLM's full admission queue)
``retry_after`` (seconds)     the ``Retry-After`` value for the two above (default 1)
``hang`` (bool)               accept chat requests and answer nothing until the fault is cleared;
                              held requests then proceed normally
``slow_first_token_ms``       extra delay before the first token, in wall-clock ms
``cut_after_tokens`` (int)    streams: drop the connection after N content tokens (no
                              finish_reason, no ``[DONE]``); non-stream: drop it mid-body
``unhealthy`` (bool)          ``GET /health`` answers 503
``flap`` (bool)               every other chat request fails with ``error_status`` (503 when
                              unset): the first fails, the second succeeds, and so on
``reset`` (bool)              read the request, then reset the connection without answering
``content_filter`` (bool)     answer with no content and ``finish_reason: "content_filter"``
                              (a hosted API's refusal)
``malformed_after_tokens``    streams: after N content tokens send an event that is not JSON;
                              non-stream: a body that is not JSON (N ignored)
``end_after_tokens`` (int)    streams: after N content tokens end the body cleanly, without a
                              finish_reason or ``[DONE]``
``omit_done`` (bool)          streams: finish the answer but never send ``data: [DONE]``
``stall_after_tokens`` (int)  streams: after N content tokens go silent for ``stall_ms``;
                              non-stream: send the status and headers at once, then stall
                              after N tokens (the body waits)
``stall_ms``                  ... milliseconds (wall clock), then carry on; a client that
                              leaves meanwhile aborts the request (logged at N tokens)
``refuses_prefill`` (bool)    answer 400 to a request that continues an assistant message
                              (``continue_final_message``, or a last message from the
                              assistant): a server that takes no assistant prefill
============================  ==============================================================

Fault delays are wall-clock, not scaled by ``time_scale``: they are test instruments for the
gateway's timeouts, which run on the real clock. Unknown keys and ill-typed values are rejected.
Chat faults act in this order, before the request is validated: hang, rate_limit, overloaded,
error_status; slow_first_token_ms and cut_after_tokens act while answering.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from backends.sim.errors import SimError, overloaded, rate_limited
from backends.sim.profiles import Flavor

__all__ = ["FaultSwitch", "Faults", "InvalidFaults", "fault_error", "prefill_refused"]


class InvalidFaults(ValueError):
    """A fault body with unknown keys or bad values."""


@dataclass(frozen=True, slots=True)
class Faults:
    error_status: int | None = None
    error_rate: float = 1.0
    rate_limit: bool = False
    overloaded: bool = False
    retry_after: float = 1.0
    hang: bool = False
    slow_first_token_ms: float = 0.0
    cut_after_tokens: int | None = None
    unhealthy: bool = False
    flap: bool = False
    reset: bool = False
    content_filter: bool = False
    malformed_after_tokens: int | None = None
    end_after_tokens: int | None = None
    omit_done: bool = False
    stall_after_tokens: int | None = None
    stall_ms: float = 0.0
    refuses_prefill: bool = False

    @classmethod
    def from_json(cls, data: Any) -> Faults:
        if not isinstance(data, Mapping):
            raise InvalidFaults("the fault body must be a JSON object")
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise InvalidFaults(f"unknown fault keys {unknown}; known: {sorted(known)}")
        values = {key: _check(key, value) for key, value in data.items() if value is not None}
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        """The fields that differ from the defaults (``{}`` when no fault is set)."""
        default = Faults()
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        }


_BOOLS = frozenset(
    {
        "rate_limit",
        "overloaded",
        "hang",
        "unhealthy",
        "flap",
        "reset",
        "content_filter",
        "omit_done",
        "refuses_prefill",
    }
)
_INTS = frozenset(
    {
        "error_status",
        "cut_after_tokens",
        "malformed_after_tokens",
        "end_after_tokens",
        "stall_after_tokens",
    }
)


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidFaults(f"`{key}` must be a number, got {value!r}")
    return float(value)


def _check(key: str, value: Any) -> Any:
    if key in _BOOLS:
        if not isinstance(value, bool):
            raise InvalidFaults(f"`{key}` must be a boolean, got {value!r}")
        return value
    if key in _INTS:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidFaults(f"`{key}` must be an integer, got {value!r}")
        if key == "error_status" and not 400 <= value <= 599:
            raise InvalidFaults("`error_status` must be 400-599")
        if key != "error_status" and value < 0:
            raise InvalidFaults(f"`{key}` must be >= 0")
        return value
    number = _number(key, value)
    if key == "error_rate" and not 0.0 <= number <= 1.0:
        raise InvalidFaults("`error_rate` must be between 0 and 1")
    if number < 0:
        raise InvalidFaults(f"`{key}` must be >= 0")
    return number


class FaultSwitch:
    """The current faults of one app, and the gate that holds hung requests."""

    def __init__(self) -> None:
        self._faults = Faults()
        self._released = asyncio.Event()
        self._released.set()
        self.closing = False
        """Set at shutdown: held requests are released and should drop their connection."""
        self._flaps = 0

    @property
    def current(self) -> Faults:
        return self._faults

    def set(self, faults: Faults) -> None:
        self._faults = faults
        self._flaps = 0
        if faults.hang:
            self._released.clear()
        else:
            self._released.set()

    def release_all(self) -> None:
        """Let every held request go (at shutdown)."""
        self.closing = True
        self._released.set()

    async def wait_released(self) -> None:
        await self._released.wait()

    def flap_fails(self) -> bool:
        """With ``flap`` on: whether this call is one of the failing half (1st, 3rd, ...)."""
        if not self._faults.flap:
            return False
        self._flaps += 1
        return self._flaps % 2 == 1


def fault_error(
    faults: Faults, rng: random.Random, *, flavor: Flavor, model: str, flap_fails: bool = False
) -> SimError | None:
    """The error an injected fault answers this request with, if any."""
    if flap_fails:
        status = faults.error_status or 503
        return SimError(status, f"Simulated flapping {status} (fault injection).", fault="flap")
    if faults.rate_limit:
        return rate_limited(flavor, model, faults.retry_after)
    if faults.overloaded:
        return overloaded(flavor, faults.retry_after, fault="overloaded")
    if faults.flap:
        return None  # the succeeding half of a flap
    if faults.error_status is not None and rng.random() < faults.error_rate:
        status = faults.error_status
        return SimError(
            status, f"Simulated error {status} (fault injection).", fault="error_status"
        )
    return None


def prefill_refused(faults: Faults, body: Any) -> SimError | None:
    """The 400 a ``refuses_prefill`` fault answers a request continuing an assistant message
    with (``continue_final_message``, or a last message from the assistant); else ``None``."""
    if not faults.refuses_prefill or not isinstance(body, Mapping):
        return None
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    prefill = body.get("continue_final_message") is True or (
        isinstance(last, Mapping) and last.get("role") == "assistant"
    )
    if not prefill:
        return None
    return SimError(
        400,
        "This model does not support assistant message prefill (fault injection).",
        param="messages",
        fault="refuses_prefill",
    )
