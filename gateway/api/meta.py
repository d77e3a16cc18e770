"""Request metadata: tiergate's optional headers, or the same keys in the OpenAI ``metadata``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.errors import InvalidRequest

__all__ = ["PRIORITIES", "RequestMeta"]

PRIORITIES = ("interactive", "standard", "batch")
_KEYS = ("app", "tags", "priority", "conversation-id", "timeout-ms", "idempotency-key")


@dataclass(frozen=True, slots=True)
class RequestMeta:
    app: str | None = None
    tags: tuple[str, ...] = ()
    priority: str | None = None
    conversation_id: str | None = None
    timeout_ms: int | None = None
    idempotency_key: str | None = None

    @classmethod
    def parse(cls, headers: Mapping[str, str], metadata: Mapping[str, str] | None) -> RequestMeta:
        """Headers win over ``metadata``; metadata keys may be written ``app`` or
        ``x-tiergate-app`` (``_`` and ``-`` alike)."""
        values: dict[str, str] = {}
        for raw_key, value in (metadata or {}).items():
            key = raw_key.lower().replace("_", "-").removeprefix("x-tiergate-")
            if key in _KEYS:
                values[key] = value
        for key in _KEYS:
            header = "idempotency-key" if key == "idempotency-key" else f"x-tiergate-{key}"
            if header in headers:
                values[key] = headers[header]
        priority = values.get("priority")
        if priority is not None and priority not in PRIORITIES:
            raise InvalidRequest(
                f"priority must be one of {', '.join(PRIORITIES)}, not {priority!r}",
                param="x-tiergate-priority",
            )
        timeout_ms = None
        if "timeout-ms" in values:
            try:
                timeout_ms = int(values["timeout-ms"])
            except ValueError:
                timeout_ms = -1
            if timeout_ms <= 0:
                raise InvalidRequest(
                    "x-tiergate-timeout-ms must be a positive integer",
                    param="x-tiergate-timeout-ms",
                )
        tags = tuple(t.strip() for t in values.get("tags", "").split(",") if t.strip())
        return cls(
            app=values.get("app") or None,
            tags=tags,
            priority=priority,
            conversation_id=values.get("conversation-id") or None,
            timeout_ms=timeout_ms,
            idempotency_key=values.get("idempotency-key") or None,
        )
