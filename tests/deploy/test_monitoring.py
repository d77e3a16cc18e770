"""deploy/monitoring: the PrometheusRule and the PodMonitors against the prometheus-operator CRD
schemas, the rules' PromQL parsed, the alerts the issue asks for present, and the dashboard built on
defined series."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import pytest

from tests.deploy.conftest import crd_errors, load_docs, load_schema
from tests.deploy.promql import (
    MONITORING,
    dashboard_exprs,
    metric_names,
    rule_exprs,
    rules,
    used_metrics,
)


def _podmonitors() -> list[dict[str, Any]]:
    return load_docs(MONITORING / "podmonitors.yaml")


def test_prometheusrule_matches_the_crd_schema() -> None:
    assert not crd_errors("prometheusrule-v1.json", rules())


def test_the_closed_schema_rejects_a_misspelt_rule_field() -> None:
    broken = copy.deepcopy(rules())
    broken["spec"]["groups"][1]["rules"][0]["anotations"] = {}
    assert crd_errors("prometheusrule-v1.json", broken)


def test_podmonitors_match_the_crd_schema() -> None:
    monitors = _podmonitors()
    assert {m["metadata"]["name"] for m in monitors} == {"tiergate", "vllm"}
    for monitor in monitors:
        errors = crd_errors("podmonitor-v1.json", monitor)
        assert not errors, (monitor["metadata"]["name"], errors)


@pytest.mark.parametrize(
    ("where", "field", "misspelt"),
    [
        (("spec",), "podMetricsEndpoints", "podMetricsEndpoint"),
        (("spec", "podMetricsEndpoints", 0), "interval", "intervall"),
    ],
)
def test_the_closed_schema_rejects_a_misspelt_podmonitor_field(
    where: tuple[str | int, ...], field: str, misspelt: str
) -> None:
    monitor = copy.deepcopy(_podmonitors()[0])
    parent: Any = monitor
    for step in where:
        parent = parent[step]
    parent[misspelt] = parent.pop(field)
    # the CRD as written accepts it (the API server would prune the field); closed, it is an error
    assert jsonschema.Draft7Validator(load_schema("podmonitor-v1.json")).is_valid(monitor)
    assert crd_errors("podmonitor-v1.json", monitor)


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
        "TiergateBudgetThresholdReached": "tiergate_budget_alert",  # the budgets' alert_at
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
    selectors = [m["spec"]["selector"]["matchLabels"] for m in _podmonitors()]
    assert {"app.kubernetes.io/name": "tiergate"} in selectors
    assert {"app.kubernetes.io/name": "vllm"} in selectors


def test_kube_prometheus_stack_selects_every_monitoring_object() -> None:
    """Its Prometheus picks PodMonitors and PrometheusRules by the label ``release: <Helm
    release>`` (podMonitorSelector / ruleSelector); without it nothing is scraped or evaluated."""
    for obj in [*_podmonitors(), rules()]:
        assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack", obj["metadata"]
