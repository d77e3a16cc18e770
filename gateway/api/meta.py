"""Request metadata: tiergate's optional headers, or the same keys in the OpenAI ``metadata``.

Every value is a name (``gateway.safe_text``): no control character, and a length limit from
``limits`` (app, each tag, conversation id, idempotency key), plus a limit on the number of
tags. A refusal names where the value came from: the header (``x-tiergate-app``) or the
metadata key as the client wrote it (``metadata.app``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.errors import InvalidRequest
from gateway.safe_text import check_name
from gateway.settings import LimitsSettings

__all__ = ["PRIORITIES", "RequestMeta"]

PRIORITIES = ("interactive", "standard", "batch")
_KEYS = ("app", "tags", "priority", "conversation-id", "timeout-ms", "idempotency-key")
_DEFAULT_LIMITS = LimitsSettings()


def _header(key: str) -> str:
    return "idempotency-key" if key == "idempotency-key" else f"x-tiergate-{key}"


def _max_chars(key: str, limits: LimitsSettings) -> int:
    if key == "app":
        return limits.max_app_chars
    if key == "tags":  # each tag is checked on its own; this bounds the whole list's text
        return limits.max_tags * (limits.max_tag_chars + 1) * 4
    if key in ("conversation-id", "idempotency-key"):
        return limits.max_id_chars
    return 32  # priority, timeout-ms


def _tags(raw: str, param: str, limits: LimitsSettings) -> tuple[str, ...]:
    tags = tuple(dict.fromkeys(t.strip() for t in raw.split(",") if t.strip()))
    if len(tags) > limits.max_tags:
        raise InvalidRequest(
            f"{param} holds {len(tags)} tags; the limit is {limits.max_tags}", param=param
        )
    for tag in tags:
        if len(tag) > limits.max_tag_chars:
            raise InvalidRequest(
                f"{param}: a tag is {len(tag)} characters; the limit is {limits.max_tag_chars}",
                param=param,
            )
    return tags


@dataclass(frozen=True, slots=True)
class RequestMeta:
    app: str | None = None
    tags: tuple[str, ...] = ()
    """Distinct, in the order given."""
    priority: str | None = None
    conversation_id: str | None = None
    timeout_ms: int | None = None
    idempotency_key: str | None = None

    @classmethod
    def parse(
        cls,
        headers: Mapping[str, str],
        metadata: Mapping[str, str] | None,
        limits: LimitsSettings = _DEFAULT_LIMITS,
    ) -> RequestMeta:
        """Headers win over ``metadata``; metadata keys may be written ``app`` or
        ``x-tiergate-app`` (``_`` and ``-`` alike)."""
        values: dict[str, tuple[str, str]] = {}  # key -> (value, where it came from)
        for raw_key, value in (metadata or {}).items():
            key = raw_key.lower().replace("_", "-").removeprefix("x-tiergate-")
            if key in _KEYS:
                values[key] = (value, f"metadata.{raw_key}")
        for key in _KEYS:
            header = _header(key)
            if header in headers:
                values[key] = (headers[header], header)
        for key, (value, param) in values.items():
            check_name(value, param=param, max_chars=_max_chars(key, limits))
        return cls(
            app=_text(values, "app"),
            tags=_tags(*values["tags"], limits) if "tags" in values else (),
            priority=_priority(values.get("priority")),
            conversation_id=_text(values, "conversation-id"),
            timeout_ms=_timeout_ms(values.get("timeout-ms")),
            idempotency_key=_text(values, "idempotency-key"),
        )


def _text(values: Mapping[str, tuple[str, str]], key: str) -> str | None:
    """The value given for ``key``; ``None`` when absent or empty."""
    given = values.get(key)
    return given[0] or None if given is not None else None


def _priority(given: tuple[str, str] | None) -> str | None:
    if given is None:
        return None
    priority, param = given
    if priority not in PRIORITIES:
        raise InvalidRequest(
            f"priority must be one of {', '.join(PRIORITIES)}, not {priority!r}", param=param
        )
    return priority


def _timeout_ms(given: tuple[str, str] | None) -> int | None:
    if given is None:
        return None
    raw, param = given
    try:
        timeout_ms = int(raw)
    except ValueError:
        timeout_ms = -1
    if timeout_ms <= 0:
        raise InvalidRequest(f"{param} must be a positive integer (ms)", param=param)
    return timeout_ms
