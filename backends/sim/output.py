"""What each of a request's ``n`` choices says: prose, a JSON document, or a tool call.

In order of precedence, for every choice:

1. **A tool call** when ``tools`` are offered and ``tool_choice`` is not ``none``, and either
   the choice requires one (``required``, or a named function) or, with ``auto``, the last message
   is the user's and names an offered tool that has not been called since (its name as written,
   or with ``_``/``-`` read as spaces; case ignored). The tool: the named one; else the first tool
   the last user message names that has not been called since it; else (``required``) the first
   offered tool not called since; else the first. The arguments fit the tool's ``parameters``
   schema (``backends.sim.schema_values``). One call per answer, ``finish_reason: tool_calls``.
2. **JSON** with ``response_format``: ``json_schema`` fits its schema; ``json_object`` fits the
   first JSON schema (an object with ``properties``) written in a message, as a prompted model
   would, else is ``{"answer": <prose>}``.
3. **Prose** otherwise (``backends.sim.answers``). A turn right after a tool result begins with
   ``Result:`` and the start of that result.

Every piece is one token (``backends.sim.tokens``): a JSON text is cut at token boundaries, each
piece keeping the whitespace before it. A tool call's pieces are its name (one piece, one token by
this simulator's count), then its arguments. ``max_tokens`` cuts any of them (``length``);
``stop`` strings cut prose and JSON, not tool calls. Choice 0 is the answer ``n=1`` would get;
the others are drawn with their index in the hash.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from backends.sim.answers import (
    Answer,
    ToolCallOut,
    answer_pieces,
    answer_rng,
    continuation_pieces,
    finish,
)
from backends.sim.request import Message, SimChatRequest, ToolSpec
from backends.sim.schema_values import schema_value

__all__ = ["choice_answers", "text_pieces"]

_PIECE = re.compile(r"\s*(?:\w{1,8}|[^\w\s])")
_RESULT_TOKENS = 40
_JSON_PROSE_TOKENS = 24


def text_pieces(text: str) -> tuple[str, ...]:
    """``text`` cut into one-token pieces, each with the whitespace before it (trailing
    whitespace is dropped)."""
    return tuple(_PIECE.findall(text))


def _mentions(text: str, name: str) -> bool:
    lowered = name.lower()
    return lowered in text or re.sub(r"[_-]+", " ", lowered) in text


def _since_last_user(messages: Sequence[Message]) -> tuple[Message | None, set[str]]:
    called: set[str] = set()
    for message in reversed(messages):
        if message.role == "user":
            return message, called
        called.update(message.tool_names)
    return None, called


def pick_tool(req: SimChatRequest) -> ToolSpec | None:
    """The tool this request's answer calls, if any (see the module docstring)."""
    choice = req.tool_choice
    if not req.tools or choice.mode == "none":
        return None
    if choice.mode == "named":
        return next(t for t in req.tools if t.name == choice.name)
    user, called = _since_last_user(req.messages)
    said = user.text.lower() if user is not None else ""
    named = [t for t in req.tools if _mentions(said, t.name)]
    fresh = [t for t in named if t.name not in called]
    if choice.mode == "auto":
        if req.messages[-1].role != "user" or not fresh:
            return None
        return fresh[0]
    for tool in (*fresh, *req.tools):
        if tool.name not in called:
            return tool
    return req.tools[0]


def _schema_in(messages: Sequence[Message]) -> Mapping[str, Any] | None:
    """The first JSON schema written in a message (how JSON-mode clients pass theirs)."""
    decoder = json.JSONDecoder()
    for message in messages:
        text = message.text
        at = text.find("{")
        while at != -1:
            try:
                found, end = decoder.raw_decode(text, at)
            except ValueError:
                at = text.find("{", at + 1)
                continue
            if isinstance(found, dict) and ("properties" in found or "$defs" in found):
                return found
            at = text.find("{", end)
    return None


def _prose(req: SimChatRequest, choice: int, lengths: Mapping[str, int]) -> tuple[str, ...]:
    messages = req.messages
    if req.continue_final and choice == 0:
        full = answer_pieces(messages[:-1], req.seed, **lengths)
        rest = continuation_pieces(full, messages[-1].text)
        if rest is not None:
            return rest
    pieces = answer_pieces(messages, req.seed, choice=choice, **lengths)
    if messages[-1].role == "tool":
        lead = text_pieces(f"Result: {messages[-1].text}")[: 2 + _RESULT_TOKENS]
        pieces = (*lead, ".", " " + pieces[0], *pieces[1:])
    return pieces


def _json_answer(req: SimChatRequest, choice: int, lengths: Mapping[str, int]) -> tuple[str, ...]:
    fmt = req.response_format
    assert fmt is not None
    schema = fmt.schema if fmt.kind == "json_schema" else _schema_in(req.messages)
    if schema is None:
        prose = answer_pieces(req.messages, req.seed, choice=choice, **lengths)
        value: Any = {"answer": "".join(prose[:_JSON_PROSE_TOKENS]).strip()}
    else:
        value = schema_value(schema, answer_rng(req.messages, req.seed, choice))
    return text_pieces(json.dumps(value, ensure_ascii=False))


def _tool_answer(req: SimChatRequest, tool: ToolSpec, choice: int, limit: int | None) -> Answer:
    arguments = schema_value(tool.parameters, answer_rng(req.messages, req.seed, choice))
    text = json.dumps(arguments, ensure_ascii=False)
    call = ToolCallOut(f"chatcmpl-tool-{uuid.uuid4().hex}", tool.name, text)
    pieces = (tool.name, *text_pieces(text))
    if limit is not None and len(pieces) > limit:
        return Answer(pieces[:limit], "length", call._replace(arguments="".join(pieces[1:limit])))
    return Answer(pieces, "tool_calls", call)


def choice_answers(
    req: SimChatRequest, *, lengths: Mapping[str, int], limit: int | None
) -> tuple[Answer, ...]:
    """The ``n`` answers of ``req``; ``lengths``: the profile's natural answer lengths
    (``min_tokens``, ``max_tokens``); ``limit``: the output limit per choice."""
    tool = pick_tool(req)
    answers: list[Answer] = []
    for choice in range(req.n):
        if tool is not None:
            answers.append(_tool_answer(req, tool, choice, limit))
            continue
        if req.response_format is not None:
            pieces = _json_answer(req, choice, lengths)
        else:
            pieces = _prose(req, choice, lengths)
        answers.append(finish(pieces, stop=req.stop, limit=limit))
    return tuple(answers)
