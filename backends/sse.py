"""Incremental parsing of a ``text/event-stream`` body (the SSE wire format).

Only what OpenAI-compatible chat streams use: ``data:`` fields, joined with ``\\n`` when an event
has several, dispatched on a blank line. Comments (``:`` lines) and the ``event``, ``id`` and
``retry`` fields are ignored. Lines may end in ``\\n``, ``\\r\\n`` or ``\\r``, and a network read
may stop anywhere, including between the ``\\r`` and ``\\n`` of one line ending.

    decoder = SSEDecoder()
    for payload in decoder.feed(network_bytes):  # zero or more complete events
        ...  # payload is bytes: b'{"id": ...}' or b"[DONE]"
"""

from __future__ import annotations

__all__ = ["DONE", "SSEDecoder"]

DONE = b"[DONE]"
"""The payload OpenAI-compatible servers send as their last event."""


class SSEDecoder:
    """Turns arbitrary slices of an SSE body into complete event payloads."""

    __slots__ = ("_data", "_tail")

    def __init__(self) -> None:
        self._tail = b""  # an unterminated line carried over to the next feed
        self._data: list[bytes] = []  # data fields of the event being built

    def feed(self, chunk: bytes) -> list[bytes]:
        """Consume ``chunk``; return the payloads of the events it completed, in order."""
        buf = self._tail + chunk if self._tail else chunk
        held = b""
        if b"\r" in buf:
            if buf.endswith(b"\r"):  # maybe the first half of "\r\n": decide on the next feed
                buf, held = buf[:-1], b"\r"
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        self._tail = lines.pop() + held
        events: list[bytes] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    events.append(data[0] if len(data) == 1 else b"\n".join(data))
                    data = []
            elif line.startswith(b"data:"):
                value = line[5:]
                data.append(value[1:] if value.startswith(b" ") else value)
            elif line == b"data":
                data.append(b"")
        self._data = data
        return events

    def flush(self) -> list[bytes]:
        """At the end of the body: the event whose data lines arrived but no blank line after.

        A line cut off mid-way (no line ending) is dropped, as the SSE rules say: it is most
        likely half a JSON object from a connection that died.
        """
        data, self._data, self._tail = self._data, [], b""
        return [b"\n".join(data)] if data else []
