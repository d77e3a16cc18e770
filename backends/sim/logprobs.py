"""Deterministic log-probabilities in vLLM's chat shape.

Each generated piece gets ``{"token", "logprob", "bytes", "top_logprobs"}``; its log-probability
(in (-3, 0]) comes from a CRC of its position and text, so the same answer always carries the same
numbers. ``top_logprobs`` lists that many candidates, most likely first: the sampled token itself,
then words from a fixed list, each less likely than the one before (``[]`` when 0 are asked for,
as vLLM answers ``logprobs: true`` without ``top_logprobs``).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

__all__ = ["logprob_content"]

_ALTERNATIVE_WORDS = " the a of to and in is that for it as with on be by this , . : ;"
_ALTERNATIVES = tuple(_ALTERNATIVE_WORDS.split(" ")[1:])


def _entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def logprob_content(pieces: Sequence[str], start: int, top: int) -> list[dict[str, Any]]:
    """The ``logprobs.content`` entries of ``pieces``, the first at position ``start`` of its
    answer, each with ``top`` alternatives."""
    out: list[dict[str, Any]] = []
    for offset, piece in enumerate(pieces):
        crc = zlib.crc32(f"{start + offset}:{piece}".encode())
        logprob = -round((crc % 3000) / 1000, 3)
        entry = _entry(piece, logprob)
        candidates = [_entry(piece, logprob)]
        for j in range(1, top):
            word = _ALTERNATIVES[(crc + j) % len(_ALTERNATIVES)]
            lower = logprob - 0.5 * j - ((crc >> j) % 7) / 100
            candidates.append(_entry(word, round(lower, 3)))
        entry["top_logprobs"] = candidates[:top]
        out.append(entry)
    return out
