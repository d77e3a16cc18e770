"""The OpenAI wire format of an answer: ``chat.completion`` bodies and SSE chunk bytes.

A stream is, in order: a first chunk with ``delta.role`` (and empty content) per choice, one chunk
per piece and choice (vLLM's shape: one choice per chunk, its ``index`` set; the pieces of step
``i`` of every choice before those of step ``i + 1``), the last of each choice carrying its
``finish_reason``; then, with ``stream_options.include_usage``,
a chunk with empty ``choices`` and ``usage``; then ``data: [DONE]``. With vLLM's
``stream_options.continuous_usage_stats`` as well, every chunk before that one also carries
``usage``: the prompt tokens and the completion tokens generated so far (0 in the role chunk).
Chunks are assembled from pre-encoded byte templates (one ``orjson.dumps`` per piece), since a
benchmark streams hundreds of answers a second through one core.

A tool call streams as vLLM streams one: a delta ``{"tool_calls": [{"index": 0, "id", "type":
"function", "function": {"name", "arguments": ""}}]}`` first, then one per argument fragment
(``{"tool_calls": [{"index": 0, "function": {"arguments": …}}]}``), ``finish_reason:
"tool_calls"`` on the last. In a complete answer the message has ``content: null`` and
``tool_calls``. With ``logprobs``, each chunk's choice carries ``logprobs.content`` for its piece
and a complete answer's choice for all of them (``backends.sim.logprobs``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import orjson

from backends.sim.answers import Answer
from backends.sim.logprobs import logprob_content
from backends.sim.profiles import Flavor

__all__ = ["DONE", "ChunkEncoder", "completion_body", "message", "usage_dict"]

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

    def role(self, usage: tuple[int, int] | None = None, index: int = 0) -> bytes:
        """The opening chunk; ``usage`` (prompt, completion tokens): continuous usage stats."""
        choice = self._choice if index == 0 else b'"choices":[{"index":%d,"delta":' % index
        return (
            self._head + choice + b'{"role":"assistant","content":""},"logprobs":null,'
            b'"finish_reason":null}]' + _close(usage)
        )

    def piece(
        self,
        answer: Answer,
        step: int,
        *,
        index: int = 0,
        finish_reason: str | None = None,
        usage: tuple[int, int] | None = None,
        top_logprobs: int | None = None,
    ) -> bytes:
        """The chunk of piece ``step`` of ``answer`` (choice ``index``); ``top_logprobs``: with
        logprobs (that many alternatives), ``None``: without."""
        piece = answer.pieces[step]
        if answer.tool_call is None and index == 0 and top_logprobs is None:
            return self.content(piece, finish_reason, usage)
        delta: dict[str, Any]
        call = answer.tool_call
        if call is None:
            delta = {"content": piece}
        elif step == 0:
            function = {"name": call.name, "arguments": ""}
            delta = {"tool_calls": [{"index": 0, "id": call.id, "type": "function",
                                     "function": function}]}  # fmt: skip
        else:
            delta = {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
        logprobs = None
        if top_logprobs is not None:
            logprobs = {"content": logprob_content(answer.pieces[step : step + 1], step,
                                                   top_logprobs)}  # fmt: skip
        choice: dict[str, Any] = {
            "index": index,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }
        if finish_reason is not None and self._stop_reason:
            choice["stop_reason"] = None
        return self._head + b'"choices":[' + orjson.dumps(choice) + b"]" + _close(usage)

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

    def finish(
        self, finish_reason: str, usage: tuple[int, int] | None = None, *, index: int = 0
    ) -> bytes:
        """An empty delta that ends choice ``index`` (an answer with nothing to say)."""
        choice = {"index": index, "delta": {"content": ""}, "logprobs": None,
                  "finish_reason": finish_reason}  # fmt: skip
        if self._stop_reason:
            choice["stop_reason"] = None
        return self._head + b'"choices":[' + orjson.dumps(choice) + b"]" + _close(usage)

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        usage = orjson.dumps(usage_dict(prompt_tokens, completion_tokens))
        return self._head + b'"choices":[],"usage":' + usage + b"}\n\n"


def _close(usage: tuple[int, int] | None) -> bytes:
    """The end of a chunk after its ``choices``: with ``usage`` (prompt, completion), that too."""
    if usage is None:
        return b"}\n\n"
    prompt, completion = usage
    return _USAGE_TAIL % (prompt, completion, prompt + completion)


def message(answer: Answer) -> dict[str, Any]:
    """The assistant message of a complete answer."""
    call = answer.tool_call
    if call is None:
        return {"role": "assistant", "content": "".join(answer.pieces)}
    function = {"name": call.name, "arguments": call.arguments}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call.id, "type": "function", "function": function}],
    }


def completion_body(
    *,
    completion_id: str,
    model: str,
    flavor: Flavor,
    answers: Sequence[Answer],
    prompt_tokens: int,
    completion_tokens: int,
    top_logprobs: int | None = None,
) -> bytes:
    """A non-streamed ``chat.completion`` body: one choice per answer; ``top_logprobs``: with
    logprobs (that many alternatives per token), ``None``: without."""
    choices: list[dict[str, Any]] = []
    for index, answer in enumerate(answers):
        choice: dict[str, Any] = {
            "index": index,
            "message": message(answer),
            "logprobs": None
            if top_logprobs is None
            else {"content": logprob_content(answer.pieces, 0, top_logprobs)},
            "finish_reason": answer.finish_reason,
        }
        if flavor == "vllm":
            choice["stop_reason"] = None
        choices.append(choice)
    body = {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage_dict(prompt_tokens, completion_tokens),
    }
    return orjson.dumps(body)
