"""The most prompt tokens a request body can cost: an upper bound, not an estimate.

Budget reservations need a number the backend's count can never exceed, whatever the prompt
(code, JSON, CJK, emoji) and whatever tokenizer the deployment uses. Every byte-level BPE
tokenizer (GPT, Llama, Mistral, Qwen, ...) turns each token into at least one byte of the text,
so a text of ``n`` UTF-8 bytes is at most ``n`` tokens. What the model reads besides the text is
the chat template's special tokens (a handful per message) and the images:

- each message: the UTF-8 bytes of its compact JSON (role, content, name, tool calls and their
  arguments: every text the template renders, plus the JSON punctuation, which only adds), with
  each image part counted as ``IMAGE_TOKENS`` instead of its URL's bytes, plus
  ``MESSAGE_TEMPLATE_TOKENS``;
- the request's tool definitions and ``response_format`` schema: the bytes of their JSON text;
- ``PROMPT_TEMPLATE_TOKENS`` once (begin-of-text, the generation prompt).

The estimate (``router.features.estimate_request_tokens``, ~4 characters a token) stays what the
rate limits, context checks and flagged usage use; this bound is only for money held back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from router.features import IMAGE_TOKENS, IMAGE_TOKENS_LOW

__all__ = ["MESSAGE_TEMPLATE_TOKENS", "PROMPT_TEMPLATE_TOKENS", "prompt_token_bound"]

MESSAGE_TEMPLATE_TOKENS = 8
"""Special tokens a chat template adds around one message (Llama 3: 4; ChatML: 5; with room)."""
PROMPT_TEMPLATE_TOKENS = 16
"""Special tokens a chat template adds once (begin-of-text, the assistant's header)."""

_DEFINITIONS = ("tools", "functions", "response_format", "tool_choice")


def _without_images(content: Sequence[Any]) -> tuple[list[Any], int]:
    parts: list[Any] = []
    images = 0
    for part in content:
        if isinstance(part, Mapping) and part.get("type") == "image_url":
            url = part.get("image_url")
            low = isinstance(url, Mapping) and url.get("detail") == "low"
            images += IMAGE_TOKENS_LOW if low else IMAGE_TOKENS
        else:
            parts.append(part)
    return parts, images


def _message_bound(message: object) -> int:
    if not isinstance(message, Mapping):
        return MESSAGE_TEMPLATE_TOKENS + len(orjson.dumps(message, default=str))
    images = 0
    content = message.get("content")
    if isinstance(content, list):
        parts, images = _without_images(content)
        message = {**message, "content": parts}
    return MESSAGE_TEMPLATE_TOKENS + images + len(orjson.dumps(message, default=str))


def prompt_token_bound(body: Mapping[str, Any]) -> int:
    """At most this many prompt tokens, for any byte-level tokenizer (module docstring)."""
    messages = body.get("messages")
    total = PROMPT_TEMPLATE_TOKENS
    if isinstance(messages, list):
        total += sum(_message_bound(m) for m in messages)
    for key in _DEFINITIONS:
        value = body.get(key)
        if value is not None:
            total += len(orjson.dumps(value, default=str))
    return total
