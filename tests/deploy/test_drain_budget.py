"""The grace periods of deploy/ leave room for the drains the settings promise: a pod (or a
compose container) is never killed while its edge or worker still drains (docs/deploy.md,
"Drain budget per cloud")."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.server import ANSWER_S
from gateway.settings import Settings, load_settings
from tests.deploy.conftest import DEPLOY
from tests.deploy.kustomize import render

TREES = ["base", "overlays/production", "overlays/all-options"]
CLOSE_S = 10.0
"""Left after a drain to answer, hand back and close the process."""


def _deployment(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == name)


def _pre_stop_s(container: dict[str, Any]) -> float:
    hook = container.get("lifecycle", {}).get("preStop")
    if hook is None:
        return 0.0
    found = re.search(r"sleep\D*(\d+)", " ".join(hook["exec"]["command"]))
    assert found, hook
    return float(found.group(1))


def _settings(docs: list[dict[str, Any]], tmp_path: Path) -> Settings:
    config = next(
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "tiergate-config"
    )
    path = tmp_path / "config.yaml"
    path.write_text(config["data"]["config.yaml"])
    return load_settings(path)


@pytest.mark.parametrize("tree", TREES)
def test_k8s_grace_periods_cover_the_drains(tree: str, tmp_path: Path) -> None:
    docs = render(DEPLOY / "k8s" / tree)
    settings = _settings(docs, tmp_path)
    gateway = _deployment(docs, "tiergate-gateway")["spec"]["template"]["spec"]
    edge = _pre_stop_s(gateway["containers"][0]) + settings.server.drain_s + ANSWER_S + CLOSE_S / 2
    assert gateway["terminationGracePeriodSeconds"] >= edge
    worker = _deployment(docs, "tiergate-worker")["spec"]["template"]["spec"]
    assert worker["terminationGracePeriodSeconds"] >= (
        _pre_stop_s(worker["containers"][0]) + settings.queue.worker_drain_s + CLOSE_S
    )
    # The defaults use what the grace allows: a drain far shorter cuts work short for nothing.
    assert gateway["terminationGracePeriodSeconds"] - edge <= 30
    assert worker["terminationGracePeriodSeconds"] - settings.queue.worker_drain_s <= 30


def _seconds(value: str) -> float:
    found = re.fullmatch(r"(\d+)s", value)
    assert found, value
    return float(found.group(1))


def test_compose_grace_periods_cover_the_drains() -> None:
    compose = yaml.safe_load((DEPLOY / "docker" / "compose.yaml").read_text(encoding="utf-8"))
    settings = Settings()
    needs = {
        "gateway": settings.server.drain_s + ANSWER_S,
        "worker": settings.queue.worker_drain_s,
    }
    for name, drain in needs.items():
        grace = _seconds(compose["services"][name]["stop_grace_period"])
        assert grace >= drain + CLOSE_S / 2, name
