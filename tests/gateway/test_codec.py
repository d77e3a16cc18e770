"""``RecordCodec``: every field of a dataclass, derived from its types; a type without a rule is
refused when the codec is built, never dropped."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from gateway.codec import ISO_TIME, RecordCodec


@dataclass(frozen=True)
class Row:
    name: str
    at: datetime
    count: int = 0
    ratio: float | None = None
    tags: tuple[str, ...] = ()
    extra: dict[str, int] = field(default_factory=dict)
    note: str | None = None


CODEC = RecordCodec(Row, {datetime: ISO_TIME}, omit_when_default=frozenset({"note"}))
AT = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)


def test_every_field_by_name_and_back() -> None:
    row = Row("a", AT, 3, 0.5, ("x", "y"), {"k": 1}, note="n")
    values = CODEC.to_values(row)
    assert set(values) == {f.name for f in dataclasses.fields(Row)} == set(CODEC.names)
    assert values["at"] == AT.isoformat() and values["tags"] == ["x", "y"]
    assert CODEC.from_values(values) == row


def test_defaults_fill_missing_keys_and_unknown_keys_are_ignored() -> None:
    values = CODEC.to_values(Row("a", AT))
    assert "note" not in values  # omitted while it holds its default
    assert CODEC.from_values({"name": "a", "at": AT.isoformat(), "later": 1}) == Row("a", AT)


def test_a_required_field_missing_is_an_error() -> None:
    with pytest.raises(KeyError, match="at"):
        CODEC.from_values({"name": "a"})


def test_scalars_are_coerced_on_the_way_in() -> None:
    row = CODEC.from_values({"name": "a", "at": AT.isoformat(), "count": "7", "ratio": 1})
    assert row.count == 7 and isinstance(row.ratio, float)


def test_a_field_type_without_a_rule_is_refused_at_build() -> None:
    @dataclass(frozen=True)
    class Priced:
        amount: Decimal

    with pytest.raises(TypeError, match=r"Priced\.amount"):
        RecordCodec(Priced)
    with pytest.raises(ValueError, match="nothing"):
        RecordCodec(Row, {datetime: ISO_TIME}, omit_when_default=frozenset({"nothing"}))
