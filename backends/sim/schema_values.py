"""A JSON value that fits a JSON schema, drawn deterministically: the simulator's structured
output (``response_format`` ``json_schema``, a schema found in a ``json_object`` prompt) and its
tool-call arguments.

What is honoured: ``type`` (one, or a list: the first that is not ``null``), ``const``, ``enum``,
``$ref`` into ``$defs`` / ``definitions`` (pydantic's nested models), ``anyOf`` / ``oneOf`` (the
first option that is not ``null``), ``allOf`` (merged), objects (every property, in order; a
property that is not listed in ``required`` is left out only past the depth limit; with no
properties, one entry of ``additionalProperties``), arrays (``items``, ``prefixItems``,
``minItems`` / ``maxItems``: two items unless they say otherwise), strings (``minLength`` /
``maxLength``, ``format`` ``date``, ``date-time``, ``time``, ``email``, ``uri``, ``uuid``),
integers and numbers (``minimum``, ``maximum``, their exclusive forms, ``multipleOf``) and
booleans. ``pattern`` is not: a string is words from the answer vocabulary. Past a nesting depth of
6 (a recursive schema), optional properties are dropped, arrays take their minimum and a nullable
value is ``null``.
"""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Mapping
from typing import Any

__all__ = ["schema_value"]

_MAX_DEPTH = 6
_WORD_LIST = (
    "river stone cloud field garden window bridge harbor valley forest meadow lantern "
    "amber coral maple cedar willow summit canyon island"
)
_WORDS = tuple(_WORD_LIST.split())
_FORMATS = {
    "date": "2026-01-15",
    "date-time": "2026-01-15T12:00:00Z",
    "time": "12:00:00",
    "email": "river@example.com",
    "uri": "https://example.com/river",
    "hostname": "example.com",
    "ipv4": "192.0.2.1",
}


class _Gen:
    def __init__(self, root: Mapping[str, Any], rng: random.Random) -> None:
        self._root = root
        self._rng = rng

    def _resolve(self, ref: str) -> Mapping[str, Any]:
        if not ref.startswith("#"):
            return {}
        node: Any = self._root
        for part in ref.lstrip("#").strip("/").split("/"):
            if not part:
                continue
            part = part.replace("~1", "/").replace("~0", "~")
            node = node.get(part) if isinstance(node, Mapping) else None
        return node if isinstance(node, Mapping) else {}

    def value(self, schema: Any, depth: int = 0) -> Any:
        if schema is True or not isinstance(schema, Mapping):
            return self._string({})
        if "$ref" in schema:
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            return self.value({**self._resolve(str(schema["$ref"])), **rest}, depth)
        if "const" in schema:
            return schema["const"]
        enum = schema.get("enum")
        if isinstance(enum, list) and enum:
            return enum[self._rng.randrange(len(enum))]
        for key in ("anyOf", "oneOf"):
            options = schema.get(key)
            if isinstance(options, list) and options:
                return self.value(self._option(options, depth), depth)
        parts = schema.get("allOf")
        if isinstance(parts, list) and parts:
            merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
            for part in parts:
                resolved = self._resolve(part["$ref"]) if "$ref" in part else part
                _merge(merged, resolved)
            return self.value(merged, depth)
        return self._typed(schema, _type_of(schema, deep=depth >= _MAX_DEPTH), depth)

    def _option(self, options: list[Any], depth: int) -> Any:
        nulls = [o for o in options if isinstance(o, Mapping) and o.get("type") == "null"]
        others = [o for o in options if o not in nulls]
        if depth >= _MAX_DEPTH and nulls:
            return nulls[0]
        return others[0] if others else options[0]

    def _typed(self, schema: Mapping[str, Any], kind: str, depth: int) -> Any:
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            return self._array(schema, depth)
        if kind == "integer":
            return self._integer(schema)
        if kind == "number":
            return self._number(schema)
        if kind == "boolean":
            return self._rng.random() < 0.5
        if kind == "null":
            return None
        return self._string(schema)

    def _object(self, schema: Mapping[str, Any], depth: int) -> dict[str, Any]:
        props = schema.get("properties")
        out: dict[str, Any] = {}
        if isinstance(props, Mapping) and props:
            required = schema.get("required")
            needed = set(required) if isinstance(required, list) else set(props)
            for name, sub in props.items():
                if depth < _MAX_DEPTH or name in needed:
                    out[str(name)] = self.value(sub, depth + 1)
            return out
        extra = schema.get("additionalProperties")
        if isinstance(extra, Mapping) and depth < _MAX_DEPTH:
            out[self._rng.choice(_WORDS)] = self.value(extra, depth + 1)
        return out

    def _array(self, schema: Mapping[str, Any], depth: int) -> list[Any]:
        lo = _int(schema.get("minItems"), 0)
        hi = _int(schema.get("maxItems"), max(lo, 2))
        prefix = schema.get("prefixItems")
        head = list(prefix) if isinstance(prefix, list) else []
        count = lo if depth >= _MAX_DEPTH else max(lo, min(hi, max(2, len(head))))
        items = schema.get("items", {})
        if items is False:
            count = min(count, len(head))
        return [self.value(head[i] if i < len(head) else items, depth + 1) for i in range(count)]

    def _integer(self, schema: Mapping[str, Any]) -> int:
        lo, hi = _bounds(schema, integer=True)
        step = schema.get("multipleOf")
        if isinstance(step, int) and step > 0:
            first = math.ceil(lo / step)
            last = max(first, math.floor(hi / step))
            return self._rng.randint(first, last) * step
        return self._rng.randint(int(lo), int(max(lo, hi)))

    def _number(self, schema: Mapping[str, Any]) -> float:
        lo, hi = _bounds(schema, integer=False)
        value = round(lo + (hi - lo) * self._rng.random(), 2)
        return min(max(value, lo), hi)

    def _string(self, schema: Mapping[str, Any]) -> str:
        fmt = schema.get("format")
        if fmt == "uuid":
            return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
        if isinstance(fmt, str) and fmt in _FORMATS:
            return _FORMATS[fmt]
        lo = _int(schema.get("minLength"), 0)
        hi = _int(schema.get("maxLength"), 10_000)
        text = " ".join(self._rng.choices(_WORDS, k=self._rng.randint(1, 3)))
        while len(text) < lo:
            text += " " + self._rng.choice(_WORDS)
        return text[:hi].rstrip() if len(text[:hi].rstrip()) >= lo else text[:hi]


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _bounds(schema: Mapping[str, Any], *, integer: bool) -> tuple[float, float]:
    nudge = 1 if integer else 0.01
    lo: float | None = None
    hi: float | None = None
    if isinstance(schema.get("minimum"), int | float):
        lo = schema["minimum"]
    if isinstance(schema.get("exclusiveMinimum"), int | float):
        lo = schema["exclusiveMinimum"] + nudge
    if isinstance(schema.get("maximum"), int | float):
        hi = schema["maximum"]
    if isinstance(schema.get("exclusiveMaximum"), int | float):
        hi = schema["exclusiveMaximum"] - nudge
    if lo is None:
        lo = min(1, hi) if hi is not None else 1
    if hi is None:
        hi = lo + 99
    if integer:
        lo, hi = math.ceil(lo), math.floor(hi)
    return lo, max(lo, hi)


def _type_of(schema: Mapping[str, Any], *, deep: bool) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        named = [k for k in kind if isinstance(k, str)]
        if deep and "null" in named:
            return "null"
        others = [k for k in named if k != "null"]
        kind = others[0] if others else (named[0] if named else None)
    if isinstance(kind, str):
        return kind
    if "properties" in schema or "additionalProperties" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema:
        return "array"
    return "string"


def _merge(into: dict[str, Any], part: Mapping[str, Any]) -> None:
    for key, value in part.items():
        if key == "properties" and isinstance(value, Mapping):
            into["properties"] = {**into.get("properties", {}), **value}
        elif key == "required" and isinstance(value, list):
            into["required"] = [*into.get("required", []), *value]
        else:
            into.setdefault(key, value)


def schema_value(schema: Any, rng: random.Random) -> Any:
    """A value fitting ``schema`` (a JSON schema, as decoded JSON), drawn from ``rng``."""
    root = schema if isinstance(schema, Mapping) else {}
    return _Gen(root, rng).value(schema)
