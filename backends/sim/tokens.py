"""Token counting: one simple deterministic rule for prompts and answers alike.

The rule: every non-space, non-word character is one token; a run of word characters
(letters, digits, ``_``) is one token per started 8 characters; whitespace is free.
``"Hello, world!"`` is 4 tokens, a 20-letter word is 3. It is a single ``re.findall`` over
``\\w{1,8}|[^\\w\\s]``, so it runs at C speed.

A chat prompt adds a Llama-3-like template overhead: 1 token for ``<|begin_of_text|>``, 4 per
message (``<|start_header_id|>``, the role, ``<|end_header_id|>``, ``<|eot_id|>``) and 3 for the
generation prompt (the assistant header). A continued final message (``continue_final_message``)
has its header but no ``<|eot_id|>`` and no generation prompt, so continuing after a prefix P costs
exactly ``count_tokens(P)`` more prompt tokens than asking afresh.

Every piece the answer generator emits (a word of at most 8 letters, or one punctuation mark) is
exactly one token under this rule, so ``count_tokens(answer) == completion_tokens``.

``chat_tokens`` spells a prompt out as that token sequence (the pieces of each text, with the
template's special tokens and the role names in their places), for the prefix cache, which
hashes it; its length is always ``prompt_tokens``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from backends.sim.request import Message

__all__ = [
    "BOS_TOKENS",
    "GENERATION_PROMPT_TOKENS",
    "MESSAGE_OVERHEAD_TOKENS",
    "chat_tokens",
    "count_tokens",
    "prompt_tokens",
    "tokenize",
]

_PIECE = re.compile(r"\w{1,8}|[^\w\s]")

BOS_TOKENS = 1
MESSAGE_OVERHEAD_TOKENS = 4
GENERATION_PROMPT_TOKENS = 3

_BOS = "<|begin_of_text|>"
_START = "<|start_header_id|>"
_END = "<|end_header_id|>"
_EOT = "<|eot_id|>"
"""Special tokens; no text tokenizes to one of them (a piece is a word run or a single mark)."""


def count_tokens(text: str) -> int:
    """Tokens in ``text`` under the module's rule."""
    return len(_PIECE.findall(text))


def tokenize(text: str) -> list[str]:
    """The tokens of ``text`` under the module's rule, in order."""
    return _PIECE.findall(text)


def chat_tokens(messages: Sequence[Message], *, continue_final: bool = False) -> list[str]:
    """The prompt as a token sequence: ``len(chat_tokens(m)) == prompt_tokens(m)``, and a later
    turn's prompt starts with an earlier turn's prompt followed by its answer's tokens (the
    generation prompt is the assistant header the next turn repeats)."""
    tokens = [_BOS]
    for message in messages:
        tokens += (_START, message.role, _END, *_PIECE.findall(message.text), _EOT)
    if continue_final and messages:
        tokens.pop()  # the open message has no <|eot_id|>
    else:
        tokens += (_START, "assistant", _END)
    return tokens


def prompt_tokens(messages: Sequence[Message], *, continue_final: bool = False) -> int:
    """Prompt tokens of a chat, template overhead included.

    With ``continue_final`` the last message is left open (no end-of-turn token, no
    generation prompt), as vLLM renders it for ``continue_final_message``.
    """
    total = BOS_TOKENS + sum(MESSAGE_OVERHEAD_TOKENS + count_tokens(m.text) for m in messages)
    if continue_final and messages:
        return total - 1  # the open message has no <|eot_id|>
    return total + GENERATION_PROMPT_TOKENS
