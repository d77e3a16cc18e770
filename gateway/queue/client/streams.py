"""Typed views of redis-py's stream replies (its annotations say little about their shape)."""

from __future__ import annotations

from typing import Any

__all__ = ["StreamEntry", "stream_entries"]

StreamEntry = tuple[bytes, dict[bytes, bytes]]


def stream_entries(response: Any) -> list[StreamEntry]:
    """The entries of an ``XREAD`` / ``XREADGROUP`` reply, over every stream it names."""
    entries: list[StreamEntry] = []
    for _stream, batch in response or ():
        for entry_id, fields in batch:
            if fields is not None:  # a deleted-but-pending entry comes back without fields
                entries.append((entry_id, fields))
    return entries
