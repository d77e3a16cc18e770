"""Accounting: prices, the SQL ledger, and cost reports."""

from gateway.accounting.ledger import SqlLedger
from gateway.accounting.prices import Charge, Price, PriceBook, load_litellm_cost_map
from gateway.accounting.records import MICRO, Attempt, Ledger, LedgerEntry, to_micro
from gateway.accounting.reports import (
    GROUP_KEYS,
    CostReport,
    CostRow,
    CostSums,
    cost_report,
    render_csv,
    render_json,
    render_table,
)

__all__ = [
    "GROUP_KEYS",
    "MICRO",
    "Attempt",
    "Charge",
    "CostReport",
    "CostRow",
    "CostSums",
    "Ledger",
    "LedgerEntry",
    "Price",
    "PriceBook",
    "SqlLedger",
    "cost_report",
    "load_litellm_cost_map",
    "render_csv",
    "render_json",
    "render_table",
    "to_micro",
]
