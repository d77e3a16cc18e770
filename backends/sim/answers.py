"""Deterministic answers: the same conversation (and seed) always gets the same text.

The answer is a tuple of *pieces*, each exactly one token under ``backends.sim.tokens``: a word
from a fixed list (with its leading space) or a punctuation mark. A stream sends one piece per
content delta. The pieces are drawn by a ``random.Random`` seeded from a BLAKE2b hash of the
messages (role and text) and the request ``seed``; the model is not part of the hash, so every
profile gives the same answer, and a continuation on another tier completes the same text. The
natural length is 20-300 tokens, also from the hash; ``max_tokens`` and ``stop`` only cut it.

Continuation (vLLM's ``continue_final_message``): if the trailing assistant text P is a prefix of
the full answer A to the conversation before it, the output is exactly the rest of A (starting with
the tail of a piece when P ends inside one). Otherwise the answer is drawn for the whole
conversation, P included.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import NamedTuple

import orjson

from backends.sim.request import Message

__all__ = ["Answer", "ToolCallOut", "answer_pieces", "answer_rng", "continuation_pieces", "finish"]

_WORD_LIST = (
    "the a an of to in on for with by from at as and or but not is are was be can will may "
    "model token tier route gateway request answer latency queue batch cache prompt context "
    "engine server client stream budget cost tenant ledger replica fallback policy signal "
    "metric sample window traffic load rate limit health probe retry timeout error status "
    "small large fast slow cheap useful simple clear stable steady quiet busy ready idle "
    "first next last every each some many few more less most often rarely always never "
    "data value number result reason choice option plan path step stage phase state event "
    "system service process thread worker task job record entry line block chunk piece "
    "read write send take give keep hold move turn start stop wait run pass fail serve "
    "measure compare predict decide select prefer expect observe report explain describe "
    "because while when where which that this these those then thus also still only even "
    "good better best high higher low lower new old early late short long wide narrow "
    "open close mark note check count track trace scale grow shrink split merge join "
    "river stone cloud field garden window bridge harbor valley forest meadow lantern"
)
_WORDS = tuple(_WORD_LIST.split())  # each at most 8 letters: one token
_PUNCT_WEIGHT = 0.07  # chance that a piece inside a sentence is a comma


class ToolCallOut(NamedTuple):
    """A tool call an answer makes: its pieces are the name (one piece), then the arguments."""

    id: str
    name: str
    arguments: str


class Answer(NamedTuple):
    pieces: tuple[str, ...]
    finish_reason: str
    """``"stop"`` (natural end or a stop string), ``"length"`` (cut by ``max_tokens``) or
    ``"tool_calls"``."""
    tool_call: ToolCallOut | None = None
    """Set when the answer is a tool call: ``pieces[0]`` is its name, the rest its arguments."""

    @property
    def content(self) -> str | None:
        return None if self.tool_call is not None else "".join(self.pieces)


def answer_rng(messages: Sequence[Message], seed: int | None, choice: int = 0) -> random.Random:
    """The draws of one choice's answer: from the messages (role and text) and the seed."""
    head: list[object] = [seed] if choice == 0 else [seed, choice]
    payload = orjson.dumps([*head, [[m.role, m.text] for m in messages]])
    digest = hashlib.blake2b(payload, digest_size=16).digest()
    return random.Random(int.from_bytes(digest, "big"))


def answer_pieces(
    messages: Sequence[Message],
    seed: int | None,
    *,
    min_tokens: int = 20,
    max_tokens: int = 300,
    choice: int = 0,
) -> tuple[str, ...]:
    """The full natural answer to ``messages``: sentences of words, commas and full stops
    (``choice``: which of ``n`` answers; 0 is the answer when ``n`` is 1)."""
    rng = answer_rng(messages, seed, choice)
    n = rng.randint(min_tokens, max_tokens)
    pieces: list[str] = []
    while len(pieces) < n:
        words = rng.choices(_WORDS, k=rng.randint(5, 16))
        sentence = [words[0].capitalize(), *words[1:]]
        if len(sentence) > 6 and rng.random() < _PUNCT_WEIGHT * len(sentence):
            sentence.insert(rng.randint(2, len(sentence) - 2), ",")
        pieces.extend(p if p == "," else " " + p for p in sentence)
        pieces.append(".")
    del pieces[n:]
    pieces[0] = pieces[0].lstrip()
    pieces[-1] = "."
    return tuple(pieces)


def continuation_pieces(full: Sequence[str], prefix: str) -> tuple[str, ...] | None:
    """The rest of ``full`` after the text ``prefix``, or ``None`` if it is not a prefix."""
    text = "".join(full)
    if not text.startswith(prefix):
        return None
    pos = 0
    for i, piece in enumerate(full):
        end = pos + len(piece)
        if end > len(prefix):
            return (piece[len(prefix) - pos :], *full[i + 1 :])
        pos = end
    return ()


def finish(pieces: tuple[str, ...], *, stop: Sequence[str], limit: int | None) -> Answer:
    """Apply ``stop`` strings (whole pieces before the first match are kept) and the limit."""
    finish_reason = "stop"
    if stop:
        text = "".join(pieces)
        hits = [i for i in (text.find(s) for s in stop) if i >= 0]
        if hits:
            cut, pos, kept = min(hits), 0, 0
            for piece in pieces:
                pos += len(piece)
                if pos > cut:
                    break
                kept += 1
            pieces = pieces[:kept]
    if limit is not None and len(pieces) > limit:
        pieces, finish_reason = pieces[:limit], "length"
    return Answer(pieces, finish_reason)
