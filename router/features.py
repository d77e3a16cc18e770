"""Prompt features: what the router knows about a request, computed once per request.

Everything here runs on the request path, so it is a handful of regex passes and no more.
Content flags (code, maths, options, script: ``router.content_flags``) describe the **last user
message**, the text the classifier scores, and of a long message only its head and tail
(``clip``), which bounds their cost; a system prompt full of formatting rules should not make
every request look like code. Token counts cover every message, in full.

``estimate_tokens`` is a cheap, deterministic estimate for context-fit checks, limits and
reservations. Billing uses the backend's ``usage``; this estimate only where a backend reported
none for a call its provider bills anyway, and the ledger flags it there. The two numbers must
agree: ``PromptFeatures.estimated_prompt_tokens`` (built with the request's
``definition_tokens``) equals ``estimate_request_tokens`` of the request body.

What the model reads besides the messages' text is counted too (docs/costs.md, "Exact and
estimated usage"): tool calls and tool results are text in the messages; the tool definitions
(``tools``, ``functions``) and a ``response_format`` JSON schema are their JSON text
(``definition_tokens``); each image part is a fixed figure from OpenAI's published tile rule
(``IMAGE_TOKENS``, ``IMAGE_TOKENS_LOW``), since the request path never fetches or decodes an
image to learn its size.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from router.content_flags import (
    FORMULA_CHARS,
    find_options,
    has_code,
    has_math,
    numbers,
    quantities,
    script,
    sentences,
    upper_share,
)

__all__ = [
    "HEAD_CHARS",
    "IMAGE_TOKENS",
    "IMAGE_TOKENS_LOW",
    "MESSAGE_OVERHEAD_TOKENS",
    "PROMPT_OVERHEAD_TOKENS",
    "TAIL_CHARS",
    "Message",
    "PromptFeatures",
    "StemSize",
    "clip",
    "definition_tokens",
    "estimate_request_tokens",
    "estimate_tokens",
    "extract_text",
    "message_text",
]

Message = Mapping[str, Any]
"""One OpenAI chat message as decoded JSON: ``{"role": ..., "content": ...}``."""

MESSAGE_OVERHEAD_TOKENS = 4
"""Tokens a chat template adds around each message (role header, separators)."""
PROMPT_OVERHEAD_TOKENS = 3
"""Tokens added once per prompt (the assistant header the model continues from)."""
IMAGE_TOKENS_LOW = 85
"""An image part with ``detail: "low"``: OpenAI's fixed 85 tokens (GPT-4o, GPT-4.1, o-series)."""
IMAGE_TOKENS = 85 + 170 * 8
"""Any other image part (``high``, ``auto``, unset): the most OpenAI's tile rule charges. The
image is fitted in 2048 x 2048, then its short side scaled to 768 px, and each 512 px tile
costs 170 tokens plus 85 once: at most 2 x 4 tiles, 1,445 tokens. The size is unknown here (the
request path fetches and decodes no image), so the bound is used: budgets never under-reserve
for an image; an estimate booked from it may over-state (a 1024 x 1024 image is 765)."""
HEAD_CHARS = 1_200
TAIL_CHARS = 300
"""Long messages are read as their first ``HEAD_CHARS`` and last ``TAIL_CHARS`` characters
(see ``clip``), by the content flags (``router.content_flags``) and by the classifier: it
bounds the cost of both."""


def clip(text: str) -> str:
    """``text``, or its head and tail joined by an ellipsis line when it is longer than both."""
    if len(text) <= HEAD_CHARS + TAIL_CHARS:
        return text
    return f"{text[:HEAD_CHARS]}\n…\n{text[-TAIL_CHARS:]}"


def message_text(message: Message) -> str:
    """The text of one message: a content string, or its ``text`` parts joined by newlines.

    Non-text parts (images, audio) are ignored (``estimate_tokens`` counts images apart). An
    assistant message's tool calls (or its deprecated ``function_call``) contribute their
    function names and arguments, since they are part of the prompt the model reads; a tool
    result is the ``tool`` message's content.
    """
    content = message.get("content")
    pieces: list[str] = []
    if isinstance(content, str):
        pieces.append(content)
    elif isinstance(content, Sequence):
        pieces.extend(_text_parts(content))
    tool_calls = message.get("tool_calls")
    if isinstance(tool_calls, Sequence) and not isinstance(tool_calls, str):
        pieces.extend(_tool_call_text(tool_calls))
    function_call = message.get("function_call")  # the deprecated form of one tool call
    if isinstance(function_call, Mapping):
        pieces.extend(_tool_call_text(({"function": function_call},)))
    return "\n".join(pieces)


def _text_parts(parts: Iterable[Any]) -> Iterable[str]:
    for part in parts:
        if isinstance(part, Mapping) and part.get("type") == "text":
            text = part.get("text")
            if isinstance(text, str):
                yield text
        elif isinstance(part, str):
            yield part


def _tool_call_text(calls: Iterable[Any]) -> Iterable[str]:
    for call in calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            yield f"{function.get('name', '')}({function.get('arguments', '')})"


def extract_text(messages: Iterable[Message]) -> str:
    """All messages' text, every role, in order, separated by blank lines (roles not included)."""
    return "\n\n".join(text for text in map(message_text, messages) if text)


def _text_tokens(text: str) -> int:
    """~4 characters per token for ASCII text; non-ASCII characters count 3/4 token each.

    Llama-3's tokenizer spends about one token per CJK character and one per two or three
    Cyrillic characters, so plain chars/4 would badly underestimate those prompts.
    """
    if text.isascii():
        return math.ceil(len(text) / 4)
    non_ascii = len(text) - len(text.encode("ascii", "ignore"))
    return math.ceil((len(text) - non_ascii) / 4 + non_ascii * 0.75)


def _image_tokens(content: Sequence[Any]) -> int:
    """The image parts of a message's ``content`` parts (``IMAGE_TOKENS``,
    ``IMAGE_TOKENS_LOW``)."""
    total = 0
    for part in content:
        if isinstance(part, Mapping) and part.get("type") == "image_url":
            image = part.get("image_url")
            low = isinstance(image, Mapping) and image.get("detail") == "low"
            total += IMAGE_TOKENS_LOW if low else IMAGE_TOKENS
    return total


def _message_tokens(message: Message, text: str) -> int:
    """One message whose text is ``text`` (``message_text``): template overhead, text, images.
    Per message, per request: a content string (most messages) costs one type check more."""
    tokens = MESSAGE_OVERHEAD_TOKENS + _text_tokens(text)
    content = message.get("content")
    if content is None or isinstance(content, str) or not isinstance(content, Sequence):
        return tokens
    return tokens + _image_tokens(content)


def _json_tokens(value: Any) -> int:
    try:
        text = orjson.dumps(value).decode()
    except TypeError:  # not JSON data: a body decoded from JSON always is
        text = str(value)
    return _text_tokens(text)


def definition_tokens(body: Mapping[str, Any]) -> int:
    """Tokens of what a request body adds to the prompt besides its messages: its tool
    definitions (``tools``, and the deprecated ``functions``) and a ``response_format`` JSON
    schema, counted as their compact JSON text. Providers render them into the prompt in a
    terser form of their own, so this errs high; 0 (three lookups) for most requests."""
    tools, functions, response_format = (
        body.get("tools"),
        body.get("functions"),
        body.get("response_format"),
    )
    if not (tools or functions or response_format):
        return 0
    total = (_json_tokens(tools) if tools else 0) + (_json_tokens(functions) if functions else 0)
    if isinstance(response_format, Mapping) and response_format.get("type") == "json_schema":
        total += _json_tokens(response_format.get("json_schema"))
    return total


def estimate_tokens(text_or_messages: str | Iterable[Message]) -> int:
    """A cheap, deterministic prompt-token estimate (context fit, limits; billing, flagged,
    only where a backend reported no usage).

    A string is counted as bare text; a message list adds ``MESSAGE_OVERHEAD_TOKENS`` per
    message and ``PROMPT_OVERHEAD_TOKENS`` once, as chat templates do, and its images
    (``IMAGE_TOKENS``). A request's tool definitions are not in its messages:
    ``estimate_request_tokens`` adds them.
    """
    if isinstance(text_or_messages, str):
        return _text_tokens(text_or_messages)
    total = PROMPT_OVERHEAD_TOKENS
    for message in text_or_messages:
        total += _message_tokens(message, message_text(message))
    return total


def estimate_request_tokens(body: Mapping[str, Any]) -> int:
    """The prompt-token estimate of a chat request body: its messages (``estimate_tokens``)
    and its definitions (``definition_tokens``); the edge's ``estimated_prompt_tokens``."""
    messages = body.get("messages")
    return estimate_tokens(messages if isinstance(messages, list) else ()) + definition_tokens(body)


@dataclass(frozen=True, slots=True)
class StemSize:
    """How much a question asks: what the size tokens (``router.classifier.size_tokens``) read."""

    numbers: int
    """Numbers written with digits (``12``, ``3.5``, ``1,200``)."""
    words: int
    """White-space separated words."""
    sentences: int
    """Sentence ends (``.``, ``?``, ``!`` before white space or the end)."""

    @classmethod
    def of(cls, stem: str) -> StemSize:
        return cls(numbers=numbers(stem), words=len(stem.split()), sentences=sentences(stem))


@dataclass(frozen=True, slots=True)
class PromptFeatures:
    """What the router knows about one request's prompt. Build with ``from_messages``."""

    last_user_text: str
    """The last user message's text (the whole prompt when there is no user message)."""
    text: str
    """Every message's text, in order (see ``extract_text``)."""
    estimated_prompt_tokens: int
    n_messages: int
    n_turns: int
    """Number of user messages."""
    has_system: bool
    has_code: bool
    has_math: bool
    n_options: int
    """Multiple-choice options (``A. …``, ``B. …``) in the last user message; 0 when none."""
    script: str
    """Dominant script of the last user message: latin, cjk, cyrillic, arabic, other, none."""
    option_lengths: tuple[int, ...] = ()
    """Characters of each multiple-choice option (empty when there are none)."""
    numeric_options: int = 0
    """Options that contain a digit."""
    upper_share: float = 0.0
    """Share of the question stem's characters that are ASCII capitals."""
    quantities: int = 0
    """Numbers with a unit in the question stem (``5 kg``, ``20%``)."""
    formula_chars: int = 0
    """Formula characters in the question stem: ``=``, ``^``, and the multiplication, division,
    root, integral, sum and pi signs."""
    question_marks: int = 0
    """``?`` in the question stem."""
    size: StemSize = StemSize(0, 0, 0)
    """How much the question stem asks: numbers, words, sentences."""

    @property
    def has_options(self) -> bool:
        return self.n_options >= 2

    @property
    def chars(self) -> int:
        """Length of the last user message in characters."""
        return len(self.last_user_text)

    @classmethod
    def from_messages(
        cls, messages: Sequence[Message], *, definition_tokens: int = 0
    ) -> PromptFeatures:
        """``definition_tokens``: the request's tool definitions and output schema
        (``definition_tokens(body)``), added to ``estimated_prompt_tokens``."""
        texts = [message_text(message) for message in messages]
        roles = [message.get("role") for message in messages]
        user_texts = [text for text, role in zip(texts, roles, strict=True) if role == "user"]
        text = "\n\n".join(t for t in texts if t)
        last_user = user_texts[-1] if user_texts else text
        tokens = (
            PROMPT_OVERHEAD_TOKENS
            + definition_tokens
            + sum(_message_tokens(m, t) for m, t in zip(messages, texts, strict=True))
        )
        scan = clip(last_user)
        options = find_options(scan)
        stem = options.stem
        return cls(
            last_user_text=last_user,
            text=text,
            estimated_prompt_tokens=tokens,
            n_messages=len(messages),
            n_turns=len(user_texts),
            has_system=any(role in ("system", "developer") for role in roles),
            has_code=has_code(scan),
            has_math=has_math(scan),
            n_options=len(options.lengths),
            script=script(scan),
            option_lengths=options.lengths,
            numeric_options=options.numeric,
            upper_share=upper_share(stem),
            quantities=quantities(stem),
            formula_chars=sum(stem.count(char) for char in FORMULA_CHARS),
            question_marks=stem.count("?"),
            size=StemSize.of(stem),
        )

    @classmethod
    def from_text(cls, text: str) -> PromptFeatures:
        """Features of a single user message (training data, tests, ``route explain``)."""
        return cls.from_messages([{"role": "user", "content": text}])
