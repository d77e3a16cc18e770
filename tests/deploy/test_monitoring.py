"""deploy/monitoring: the PrometheusRule against the prometheus-operator CRD schema, its PromQL
parsed, the alerts the issue asks for present, and the dashboard built on defined series."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest
import yaml

from tests.deploy.conftest import load_schema
from tests.deploy.promql import (
    MONITORING,
    dashboard_exprs,
    metric_names,
    rule_exprs,
    rules,
    used_metrics,
)
from tests.deploy.test_k8s import closed


def test_prometheusrule_matches_the_crd_schema() -> None:
    validator = jsonschema.Draft7Validator(closed(load_schema("prometheusrule-v1.json")))
    errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(rules())]
    assert not errors


def test_the_closed_schema_rejects_a_misspelt_rule_field() -> None:
    broken = copy.deepcopy(rules())
    broken["spec"]["groups"][1]["rules"][0]["anotations"] = {}
    validator = jsonschema.Draft7Validator(closed(load_schema("prometheusrule-v1.json")))
    assert list(validator.iter_errors(broken))


@pytest.mark.parametrize("expr", rule_exprs() + dashboard_exprs())
def test_every_expression_is_valid_promql(expr: str) -> None:
    assert metric_names(expr)


def test_invalid_promql_is_caught() -> None:
    with pytest.raises(ValueError):
        metric_names("sum by (tier (rate(tiergate_requests_total[5m]))")


def test_the_alerts_the_issue_asks_for() -> None:
    alerts = {r["alert"]: r for g in rules()["spec"]["groups"] for r in g["rules"] if "alert" in r}
    wanted = {
        "TiergateTTFTP99High": "tiergate:ttft_seconds:p99_5m",
        "TiergateQueueWaitHigh": "tiergate:queue_wait_seconds:p99_5m",
        "TiergateBreakerOpen": "tiergate_breaker_state",
        "TiergateBudgetBurn": "tiergate_budget_spent_ratio",
        "TiergateSpendSpike": "tiergate:cost_usd:rate1h",
        "TiergateUnpricedTraffic": "tiergate_unknown_price_requests_total",
        "TiergateErrorRateHigh": "tiergate:server_error_ratio:rate5m",
    }
    for alert, series in wanted.items():
        assert series in metric_names(alerts[alert]["expr"]), alert
        assert alerts[alert]["annotations"]["summary"]


def test_recording_rules_used_are_defined() -> None:
    recorded = {r["record"] for g in rules()["spec"]["groups"] for r in g["rules"] if "record" in r}
    for expr in rule_exprs() + dashboard_exprs():
        for name in metric_names(expr):
            if name.startswith("tiergate:"):
                assert name in recorded, name


def test_only_our_and_vllm_metrics_are_read() -> None:
    names = used_metrics()
    assert names
    assert all(n.startswith(("tiergate_", "vllm:")) for n in names), names


def test_dashboard_panels_have_targets_and_a_datasource_variable() -> None:
    board = json.loads((MONITORING / "grafana-dashboard.json").read_text(encoding="utf-8"))
    assert board["templating"]["list"][0]["type"] == "datasource"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)) and all(p["targets"] for p in board["panels"])


def test_podmonitors_parse_and_select_the_pods_of_deploy_k8s() -> None:
    monitors = list(yaml.safe_load_all((MONITORING / "podmonitors.yaml").read_text("utf-8")))
    selectors = [m["spec"]["selector"]["matchLabels"] for m in monitors]
    assert {"app.kubernetes.io/name": "tiergate"} in selectors
    assert {"app.kubernetes.io/name": "vllm"} in selectors
