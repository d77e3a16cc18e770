"""Frozen dataclass records to and from plain values (what JSON and SQL rows hold), derived from
the dataclass's fields and their types.

    codec = RecordCodec(LedgerEntry, {datetime: ISO_TIME, Attempt: (Attempt.to_dict, ...)})
    values = codec.to_values(entry)        # every field, by name
    entry = codec.from_values(values)      # a missing key takes the field's default

A field is never forgotten: the codec walks ``dataclasses.fields`` and refuses, when it is
built (at import), a field type it has no rule for. Rules: ``str``, ``int``, ``float`` and
``bool`` are coerced on the way in; ``dict[...]`` passes as is; ``X | None`` and
``tuple[X, ...]`` (a list in plain values) follow ``X``; any other type needs a converter pair.
A leaf: it imports nothing of ours.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Generic, TypeVar

__all__ = ["ISO_TIME", "NATIVE", "Convert", "RecordCodec"]

T = TypeVar("T")

Convert = tuple[Callable[[Any], Any], Callable[[Any], Any]]
"""``(encode, decode)``: a value to its plain form, and back."""


def _same(value: Any) -> Any:
    return value


NATIVE: Convert = (_same, _same)
"""A value kept as it is (a SQL driver takes and returns it: a ``datetime`` for a SQL row)."""
ISO_TIME: Convert = (datetime.isoformat, datetime.fromisoformat)
"""A ``datetime`` as ISO 8601 text (JSON)."""

_SCALARS: dict[Any, Convert] = {
    str: (_same, str),
    int: (_same, int),
    float: (_same, float),
    bool: (_same, bool),
}


def _optional(inner: Convert) -> Convert:
    encode, decode = inner
    return (
        _same if encode is _same else lambda v: None if v is None else encode(v),
        lambda v: None if v is None else decode(v),
    )


def _sequence(inner: Convert) -> Convert:
    encode, decode = inner
    return (
        list if encode is _same else lambda v: [encode(x) for x in v],
        lambda v: tuple(decode(x) for x in v),
    )


class RecordCodec(Generic[T]):
    """The codec of one dataclass. ``converters``: the pair for each type the rules above do
    not cover. ``omit_when_default``: fields left out of ``to_values`` while they hold their
    default (fields added after older readers and writers, kept out of their way)."""

    def __init__(
        self,
        cls: type[T],
        converters: Mapping[Any, Convert] | None = None,
        *,
        omit_when_default: frozenset[str] = frozenset(),
    ) -> None:
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"{cls!r} is not a dataclass")
        hints = typing.get_type_hints(cls)
        known = {**_SCALARS, **(converters or {})}
        self._cls = cls
        self._fields = dataclasses.fields(cls)
        self._converts = {f.name: _convert(known, hints[f.name], cls, f.name) for f in self._fields}
        unknown = omit_when_default - set(self._converts)
        if unknown:
            raise ValueError(f"{cls.__name__} has no fields {sorted(unknown)}")
        self._defaults = {f.name: _default(f) for f in self._fields}
        # (name, encoder or None when the value is its own plain form, default or MISSING to
        # write it always): the hot path of ``to_values``
        self._encoders = tuple(
            (
                name,
                None if encode is _same else encode,
                self._defaults[name] if name in omit_when_default else dataclasses.MISSING,
            )
            for name, (encode, _decode) in self._converts.items()
        )

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self._fields)

    def to_values(self, record: T) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name, encode, omitted in self._encoders:
            value = getattr(record, name)
            if omitted is not dataclasses.MISSING and value == omitted:
                continue
            values[name] = value if encode is None else encode(value)
        return values

    def from_values(self, values: Mapping[Any, Any]) -> T:
        """The record; a key missing from ``values`` takes its field's default (``KeyError``
        for a field without one). Keys the record does not know are ignored."""
        kwargs: dict[str, Any] = {}
        for name, (_encode, decode) in self._converts.items():
            if name in values:
                kwargs[name] = decode(values[name])
            elif self._defaults[name] is dataclasses.MISSING:
                raise KeyError(name)
        return self._cls(**kwargs)


def _convert(known: Mapping[Any, Convert], hint: Any, cls: type, name: str) -> Convert:
    if hint in known:
        return known[hint]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union) and len(args) == 2 and type(None) in args:
        inner = args[0] if args[1] is type(None) else args[1]
        return _optional(_convert(known, inner, cls, name))
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _sequence(_convert(known, args[0], cls, name))
    if origin is dict:
        return NATIVE
    raise TypeError(f"{cls.__name__}.{name}: no codec for {hint!r}; pass a converter pair")


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING
