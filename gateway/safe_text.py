"""What a string from outside may hold before tiergate stores, logs, echoes or routes on it.

PostgreSQL's ``text`` and ``jsonb`` cannot hold NUL (U+0000): one row with it makes the whole
batch it is in fail. A lone surrogate (U+D800-U+DFFF; Python's ``json`` decodes ``"\\ud800"``
to one) cannot be encoded as UTF-8 at all. So no string a request brings may hold either.

Two kinds of strings, two rules:

- **names** — ``model``, ``user``, the request metadata (app, tags, priority, conversation id,
  idempotency key), tenant and principal names, key ids and notes, report filters: no control
  character at all (C0, U+0000-U+001F, and DEL, U+007F) and no surrogate, and a length limit.
  They reach ledger rows, Redis keys, log lines and response headers, where a newline or an
  escape sequence is never meant and can forge a line or a header.
- **prose** — message text and every other string a request passes through to a backend: any
  character but NUL and surrogates. Tabs, newlines and escape sequences are legitimate content
  of a prompt (pasted code, terminal output).

``check_name`` and ``find_nul`` refuse with ``InvalidRequest`` naming the field (``param``);
``SafeName`` is the same rule as a pydantic type, for request bodies, path and query parameters.
Backends' error messages, the one other text from outside that reaches the ledger (an attempt's
``error``), are cleaned where they are made (``backends.errors.BackendError``).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from gateway.errors import InvalidRequest

__all__ = [
    "MAX_NAME_CHARS",
    "SafeName",
    "check_name",
    "find_nul",
    "name_problem",
    "no_control",
]

MAX_NAME_CHARS = 128
"""The length of a name whose limit is not a setting: tenant and principal names, key ids,
report and admin filters."""

_NOT_IN_NAMES = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")
_NOT_IN_PROSE = re.compile("[\x00\ud800-\udfff]")
_NUL_IN_JSON = b"\\u0000"
"""The only way a JSON text can carry NUL (a raw control character is not valid JSON, and
orjson refuses lone surrogates): a body without these six bytes holds no NUL anywhere."""


def _describe(char: str) -> str:
    return "NUL (U+0000)" if char == "\x00" else f"U+{ord(char):04X}"


def name_problem(value: str, max_chars: int) -> str | None:
    """``None`` if ``value`` is a valid name of at most ``max_chars`` characters, else why not
    (without echoing the value)."""
    if len(value) > max_chars:
        return f"is {len(value)} characters; the limit is {max_chars}"
    bad = _NOT_IN_NAMES.search(value)
    if bad is not None:
        return f"contains the control character {_describe(bad.group())} at {bad.start()}"
    return None


def check_name(value: str, *, param: str, max_chars: int) -> str:
    """``value`` if it is a valid name, else ``InvalidRequest`` naming ``param``."""
    problem = name_problem(value, max_chars)
    if problem is not None:
        raise InvalidRequest(f"{param} {problem}", param=param)
    return value


def no_control(value: str) -> str:
    """A pydantic validator: the name rule without a length limit (give ``max_length``)."""
    bad = _NOT_IN_NAMES.search(value)
    if bad is not None:
        raise ValueError(f"contains the control character {_describe(bad.group())}")
    return value


SafeName = Annotated[str, Field(max_length=MAX_NAME_CHARS), AfterValidator(no_control)]
"""A name of up to ``MAX_NAME_CHARS`` characters, as a pydantic type (path and query
parameters, body fields); other limits: ``Annotated[str, Field(max_length=N),
AfterValidator(no_control)]``."""


def _segment(key: str) -> str:
    return _NOT_IN_NAMES.sub("?", key)[:64]


def _walk(value: Any, path: str) -> str | None:
    if isinstance(value, str):
        return path if _NOT_IN_PROSE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}.{_segment(key)}" if path else _segment(key)
            if _NOT_IN_PROSE.search(key):
                return here
            if (found := _walk(item, here)) is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if (found := _walk(item, f"{path}.{i}" if path else str(i))) is not None:
                return found
    return None


def find_nul(raw: bytes, data: Any) -> None:
    """Refuse a JSON request whose strings (keys or values, anywhere) hold NUL: ``raw`` is the
    body as received, ``data`` the same parsed. The common case costs one scan of ``raw``."""
    if _NUL_IN_JSON not in raw:
        return
    where = _walk(data, "")
    if where is not None:
        raise InvalidRequest(
            f"{where} contains NUL (U+0000), which no string of a request may hold", param=where
        )
