"""The two rules for strings from outside (``gateway.safe_text``): names hold no control
character and have a length limit; nothing holds NUL or a lone surrogate."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from pydantic import BaseModel, ValidationError

from backends.errors import BackendUnavailable
from gateway.errors import InvalidRequest
from gateway.safe_text import SafeName, check_name, find_nul, name_problem


@pytest.mark.parametrize("bad", ["\x00", "a\x01", "tab\there", "line\n", "\r", "del\x7f", "\ud800"])
def test_names_hold_no_control_character(bad: str) -> None:
    problem = name_problem(bad, 100)
    assert problem is not None and "control character" in problem
    with pytest.raises(InvalidRequest) as info:
        check_name(bad, param="user", max_chars=100)
    assert info.value.param == "user" and info.value.status == 400


@pytest.mark.parametrize("good", ["acme", "ünïcode ✓", "a b-c_d.e:f/g", "x" * 100, "\x85nel"])
def test_names_may_hold_any_other_character(good: str) -> None:
    assert name_problem(good, 100) is None


def test_a_long_name_is_refused_without_echoing_it() -> None:
    with pytest.raises(InvalidRequest) as info:
        check_name("y" * 5000, param="model", max_chars=256)
    assert "5000 characters; the limit is 256" in info.value.message
    assert "yyyy" not in info.value.message


def _body(data: Any) -> tuple[bytes, Any]:
    raw = orjson.dumps(data)
    return raw, orjson.loads(raw)


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({"messages": [{"role": "user", "content": "a\x00"}]}, "messages.0.content"),
        (
            {"messages": [{"content": [{"type": "text", "text": "\x00"}]}]},
            "messages.0.content.0.text",
        ),
        ({"tools": [{"function": {"description": "\x00"}}]}, "tools.0.function.description"),
        ({"stop": ["ok", "\x00"]}, "stop.1"),
        ({"metadata": {"k\x00": "v"}}, "metadata.k?"),
    ],
)
def test_nul_anywhere_in_a_body_is_refused_naming_where(data: Any, where: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        find_nul(*_body(data))
    assert info.value.param == where


def test_prose_keeps_every_other_character() -> None:
    text = "code:\n\tx = 1\r\n\x1b[31mred\x1b[0m \x07 \\u0000 is how JSON writes NUL"
    find_nul(*_body({"messages": [{"role": "user", "content": text}]}))  # no refusal


class _Form(BaseModel):
    name: SafeName


def test_the_pydantic_type() -> None:
    assert _Form(name="acme").name == "acme"
    for bad in ("a\x00", "x" * 129):
        with pytest.raises(ValidationError):
            _Form(name=bad)


def test_backend_messages_lose_nul_and_lone_surrogates() -> None:
    """A backend's error text reaches the ledger (an attempt's ``error``)."""
    error = BackendUnavailable("bad\x00gate\ud800way\nline", backend="b", status=502)
    assert error.message == "bad\ufffdgate\ufffdway\nline"
    assert "\x00" not in str(error)
    orjson.dumps(str(error))  # encodable
