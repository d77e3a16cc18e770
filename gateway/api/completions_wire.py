"""``POST /v1/completions`` (OpenAI's legacy text completions) on the chat path.

The request becomes a chat request whose one user message is the ``prompt``: it is routed,
limited, queued, billed and booked as that chat request (the prompt is the text the classifier
scores), and the chat answer is turned back into a ``text_completion`` (``CompletionShape``).
A served model therefore applies its chat template to the prompt: ``/v1/completions`` here is
an answer to the prompt, not a raw continuation of it.

Refused with a 400 naming the field, as they cannot be served that way: a ``prompt`` that is
not one string (a list of several prompts, or token ids), ``echo``, ``suffix``, ``best_of``
over 1, and ``logprobs`` (the legacy per-token format).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import orjson
from pydantic import Field, StrictBool, StrictStr

from gateway.api.admission import Admitted, admit, parse_body
from gateway.api.schemas import SamplingRequest
from gateway.api.shapes import DONE, StreamShape, sse_data
from gateway.errors import InvalidRequest
from gateway.settings import LimitsSettings

__all__ = ["COMPLETION", "CompletionRequest", "CompletionShape", "admit_completion"]


class CompletionRequest(SamplingRequest):
    """What ``/v1/completions`` accepts (unknown fields pass through to the backends)."""

    prompt: StrictStr | Annotated[list[StrictStr], Field(min_length=1, max_length=1)]
    echo: StrictBool | None = None
    suffix: StrictStr | None = None
    best_of: Annotated[int, Field(ge=1)] | None = None
    logprobs: int | None = None


_UNSERVED = ("echo", "suffix", "best_of", "logprobs")


def _refuse_unserved(request: CompletionRequest) -> None:
    if request.echo:
        raise InvalidRequest(
            "echo is not supported: the prompt is answered, not continued", param="echo"
        )
    if request.suffix is not None:
        raise InvalidRequest("suffix (insertion) is not supported", param="suffix")
    if request.best_of is not None and request.best_of > 1:
        raise InvalidRequest("best_of over 1 is not supported; use n", param="best_of")
    if request.logprobs is not None:
        raise InvalidRequest(
            "logprobs is not supported on /v1/completions; /v1/chat/completions has them",
            param="logprobs",
        )


def admit_completion(raw: bytes, headers: dict[str, str], limits: LimitsSettings) -> Admitted:
    """The completions body ``raw``, admitted as the chat request it runs as."""
    data, request = parse_body(raw, CompletionRequest)
    _refuse_unserved(request)
    prompt = request.prompt if isinstance(request.prompt, str) else request.prompt[0]
    chat = {k: v for k, v in data.items() if k not in ("prompt", *_UNSERVED)}
    chat["messages"] = [{"role": "user", "content": prompt}]
    try:
        return admit(orjson.dumps(chat), headers, limits)
    except InvalidRequest as exc:
        if exc.param is not None and exc.param.startswith("messages"):
            exc.param = "prompt"
            exc.message = exc.message.replace("messages.0.content", "prompt")
        raise


def _choice(choice: Mapping[str, Any], text: Any) -> dict[str, Any]:
    return {
        "index": choice.get("index", 0),
        "text": text if isinstance(text, str) else "",
        "logprobs": None,
        "finish_reason": choice.get("finish_reason"),
    }


def _completion(body: Mapping[str, Any], choices: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": str(body.get("id", "")).replace("chatcmpl-", "cmpl-", 1),
        "object": "text_completion",
        "created": body.get("created"),
        "model": body.get("model"),
        "choices": choices,
    }
    for key in ("usage", "system_fingerprint", "x_tiergate"):
        if key in body:
            out[key] = body[key]
    return out


class _CompletionStream:
    def chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        choices = [
            _choice(c, (c.get("delta") or {}).get("content")) for c in chunk.get("choices") or []
        ]
        return [sse_data(_completion(chunk, choices))]

    def end(self) -> list[bytes]:
        return [DONE]

    def error(self, closing: dict[str, Any], error: Mapping[str, Any]) -> list[bytes]:
        return [*self.chunk(closing), sse_data(error)]


class CompletionShape:
    """A ``chat.completion`` as a ``text_completion``; chunks alike."""

    _STREAM = _CompletionStream()

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        choices = [
            _choice(c, (c.get("message") or {}).get("content")) for c in body.get("choices") or []
        ]
        return _completion(body, choices)

    def stream(self, request_id: str) -> StreamShape:
        return self._STREAM

    def param(self, name: str | None) -> str | None:
        return name


COMPLETION = CompletionShape()
