"""The OpenAI wire format of an answer: ``chat.completion`` bodies and SSE chunk bytes.

A stream is, in order: a first chunk with ``delta.role`` (and empty content), one chunk per content
piece, the last of which carries ``finish_reason``; then, with ``stream_options.include_usage``,
a chunk with empty ``choices`` and ``usage``; then ``data: [DONE]``. With vLLM's
``stream_options.continuous_usage_stats`` as well, every chunk before that one also carries
``usage``: the prompt tokens and the completion tokens generated so far (0 in the role chunk).
Chunks are assembled from pre-encoded byte templates (one ``orjson.dumps`` per piece), since a
benchmark streams hundreds of answers a second through one core.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from backends.sim.profiles import Flavor

__all__ = ["DONE", "ChunkEncoder", "completion_body", "usage_dict"]

DONE = b"data: [DONE]\n\n"
_USAGE_TAIL = b',"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}\n\n'


def usage_dict(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class ChunkEncoder:
    """SSE ``data:`` lines of one streamed answer."""

    def __init__(self, *, completion_id: str, model: str, flavor: Flavor) -> None:
        head = orjson.dumps(
            {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": model,
            }
        )
        self._head = b"data: " + head[:-1] + b","  # the object left open: choices come next
        self._choice = b'"choices":[{"index":0,"delta":'
        self._stop_reason = b',"stop_reason":null' if flavor == "vllm" else b""

    def role(self, usage: tuple[int, int] | None = None) -> bytes:
        """The opening chunk; ``usage`` (prompt, completion tokens): continuous usage stats."""
        return (
            self._head + self._choice + b'{"role":"assistant","content":""},"logprobs":null,'
            b'"finish_reason":null}]' + _close(usage)
        )

    def content(
        self,
        piece: str,
        finish_reason: str | None = None,
        usage: tuple[int, int] | None = None,
    ) -> bytes:
        delta = b'{"content":' + orjson.dumps(piece) + b'},"logprobs":null,"finish_reason":'
        if finish_reason is None:
            return self._head + self._choice + delta + b"null}]" + _close(usage)
        tail = orjson.dumps(finish_reason) + self._stop_reason + b"}]" + _close(usage)
        return self._head + self._choice + delta + tail

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        usage = orjson.dumps(usage_dict(prompt_tokens, completion_tokens))
        return self._head + b'"choices":[],"usage":' + usage + b"}\n\n"


def _close(usage: tuple[int, int] | None) -> bytes:
    """The end of a chunk after its ``choices``: with ``usage`` (prompt, completion), that too."""
    if usage is None:
        return b"}\n\n"
    prompt, completion = usage
    return _USAGE_TAIL % (prompt, completion, prompt + completion)


def completion_body(
    *,
    completion_id: str,
    model: str,
    flavor: Flavor,
    text: str,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
) -> bytes:
    """A non-streamed ``chat.completion`` body."""
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "logprobs": None,
        "finish_reason": finish_reason,
    }
    if flavor == "vllm":
        choice["stop_reason"] = None
    body = {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage_dict(prompt_tokens, completion_tokens),
    }
    return orjson.dumps(body)
