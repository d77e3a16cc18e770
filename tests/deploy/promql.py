"""The PromQL in deploy/monitoring: every expression, parsed, and the metric names it reads."""

from __future__ import annotations

import json
from typing import Any

import promql_parser
import yaml

from tests.deploy.conftest import DEPLOY

__all__ = ["dashboard_exprs", "metric_names", "rule_exprs", "rules", "used_metrics"]

MONITORING = DEPLOY / "monitoring"


def rules() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(
        (MONITORING / "prometheus-rules.yaml").read_text(encoding="utf-8")
    )
    return data


def rule_exprs() -> list[str]:
    return [str(r["expr"]) for g in rules()["spec"]["groups"] for r in g["rules"]]


def dashboard_exprs() -> list[str]:
    board = json.loads((MONITORING / "grafana-dashboard.json").read_text(encoding="utf-8"))
    return [t["expr"] for p in board["panels"] for t in p["targets"]]


def metric_names(expr: str) -> set[str]:
    """Names of the series an expression selects (parsing fails on invalid PromQL)."""
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def used_metrics() -> set[str]:
    """Exported metric names the rules and the dashboard read (recording rules' own outputs,
    ``tiergate:…``, resolved to what they are built from)."""
    recorded = {r["record"] for g in rules()["spec"]["groups"] for r in g["rules"] if "record" in r}
    names: set[str] = set()
    for expr in rule_exprs() + dashboard_exprs():
        names |= metric_names(expr)
    return names - recorded
