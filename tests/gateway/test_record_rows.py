"""Records stored one row each through a ``RecordCodec``: the codec's field names are the table's
columns, so a field added to the record without a column (or a column without a field) fails
here rather than being dropped silently on the way in or out."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import Table

from gateway.accounting.dead_letters import DeadLetter
from gateway.accounting.schema import ledger_dead_letters
from gateway.auth.schema import api_keys
from gateway.auth.tenants import KeyRecord
from gateway.codec import NATIVE, RecordCodec
from gateway.rules.schema import rule_versions
from gateway.rules.store import RuleVersion

ROWS: list[tuple[type[Any], Table]] = [
    (KeyRecord, api_keys),
    (DeadLetter, ledger_dead_letters),
    (RuleVersion, rule_versions),
]


@pytest.mark.parametrize(("record", "table"), ROWS, ids=lambda v: getattr(v, "__name__", str(v)))
def test_a_records_fields_are_its_tables_columns(record: type[Any], table: Table) -> None:
    names = set(RecordCodec(record, {datetime: NATIVE}).names)
    assert names == set(table.columns.keys())
