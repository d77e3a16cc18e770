"""deploy/k8s rendered (base, production, every switch on): core kinds against the Kubernetes
schemas with ``kubernetes-validate`` (strict: unknown fields fail), KEDA objects against the
ScaledObject CRD schema, and the properties the issue asks of the pools."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gateway.services import build_catalog
from gateway.settings import Settings
from router.catalog import Tier
from tests.deploy.conftest import DEPLOY, crd_errors
from tests.deploy.kustomize import render

K8S = DEPLOY / "k8s"
TREES = ["base", "overlays/production", "overlays/all-options"]
K8S_VERSION = "1.33.0"
CRD_KINDS = {"ScaledObject"}


def _docs(tree: str) -> list[dict[str, Any]]:
    return render(K8S / tree)


def _by(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


@pytest.mark.parametrize("tree", TREES)
def test_core_kinds_validate_strictly(tree: str) -> None:
    docs = [d for d in _docs(tree) if d["kind"] not in CRD_KINDS]
    assert len(docs) > 20
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_kubernetes_validate_catches_a_wrong_field() -> None:
    doc = copy.deepcopy(_by(_docs("base"), "Deployment", "vllm-llama-70b-awq"))
    doc["spec"]["template"]["spec"]["containers"][0]["startupprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("tree", TREES)
def test_scaledobjects_match_the_keda_crd_schema(tree: str) -> None:
    objects = [d for d in _docs(tree) if d["kind"] == "ScaledObject"]
    assert {o["metadata"]["name"] for o in objects} == {
        "tiergate-worker",
        "vllm-llama-8b-spot",
        "vllm-llama-8b",
        "vllm-llama-70b-awq",
    }
    for obj in objects:
        errors = crd_errors("keda-scaledobject-v1alpha1.json", obj)
        assert not errors, (obj["metadata"]["name"], errors)


def test_the_closed_keda_schema_rejects_a_field_keda_would_prune() -> None:
    obj = copy.deepcopy(_by(_docs("base"), "ScaledObject", "tiergate-worker"))
    obj["spec"]["minReplicas"] = 1  # a HorizontalPodAutoscaler name, not KEDA's
    assert crd_errors("keda-scaledobject-v1alpha1.json", obj)


def test_every_scaledobject_targets_a_deployment_and_pools_scale_on_vllm_waiting() -> None:
    docs = _docs("base")
    deployments = {d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"}
    for obj in (d for d in docs if d["kind"] == "ScaledObject"):
        assert obj["spec"]["scaleTargetRef"]["name"] in deployments
        queries = [t["metadata"]["query"] for t in obj["spec"]["triggers"]]
        if obj["metadata"]["name"].startswith("vllm-"):
            assert any("vllm:num_requests_waiting" in q for q in queries)
            # wake from zero: a signal from outside the engine, with activation at 0
            wake = [t for t in obj["spec"]["triggers"] if "tiergate_" in t["metadata"]["query"]]
            assert wake and all(t["metadata"]["activationThreshold"] == "0" for t in wake)


def _pool(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return _by(docs, "Deployment", name)["spec"]["template"]["spec"]


@pytest.mark.parametrize(
    ("name", "startup_s"),
    [("vllm-llama-8b-spot", 600), ("vllm-llama-8b", 600), ("vllm-llama-70b-awq", 1200)],
)
def test_vllm_pools_probe_drain_and_mount_shm_and_cache(name: str, startup_s: int) -> None:
    spec = _pool(_docs("base"), name)
    container = spec["containers"][0]
    assert container["image"] == "vllm/vllm-openai:v0.33.0"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= startup_s
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    shutdown = next(
        int(a.split("=")[1]) for a in container["args"] if a.startswith("--shutdown-timeout=")
    )
    assert spec["terminationGracePeriodSeconds"] >= pre_stop + shutdown
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/dev/shm", "/root/.cache/huggingface", "/root/.cache/vllm"} <= mounts


def test_70b_pool_runs_awq_marlin_on_two_gpus() -> None:
    container = _pool(_docs("base"), "vllm-llama-70b-awq")["containers"][0]
    assert "--quantization=awq_marlin" in container["args"]
    assert "--tensor-parallel-size=2" in container["args"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"


def test_switches_change_only_what_they_claim() -> None:
    base, options = _docs("base"), _docs("overlays/all-options")
    args_70b = _pool(options, "vllm-llama-70b-awq")["containers"][0]["args"]
    assert any(a.startswith("--speculative-config=") for a in args_70b)
    ondemand = _pool(options, "vllm-llama-8b")["containers"][0]
    assert ondemand["resources"]["limits"] == {"memory": "32Gi", "nvidia.com/mig-3g.40gb": "1"}
    assert "--max-num-seqs=64" in ondemand["args"]
    assert _pool(options, "vllm-llama-8b-spot") == _pool(base, "vllm-llama-8b-spot")


def test_spot_and_on_demand_pools_are_separate_and_spot_is_preferred() -> None:
    docs = _docs("base")
    spot, ondemand = _pool(docs, "vllm-llama-8b-spot"), _pool(docs, "vllm-llama-8b")
    assert spot["nodeSelector"]["karpenter.sh/capacity-type"] == "spot"
    assert ondemand["nodeSelector"]["karpenter.sh/capacity-type"] == "on-demand"
    config = yaml.safe_load(_by(docs, "ConfigMap", "tiergate-config")["data"]["config.yaml"])
    settings = Settings(**config)
    small = [d.model for d in build_catalog(settings).of_tier(Tier.SMALL)]
    assert small == ["llama-3.1-8b-instruct-spot", "llama-3.1-8b-instruct"]
    served = {
        a.split("=", 1)[1]
        for name in ("vllm-llama-8b-spot", "vllm-llama-8b", "vllm-llama-70b-awq")
        for a in _pool(docs, name)["containers"][0]["args"]
        if a.startswith("--served-model-name=")
    }
    assert served == {d.model for d in settings.deployments if d.provider == "vllm"}


def test_every_pod_template_has_a_pdb_and_vllm_is_fenced_by_a_networkpolicy() -> None:
    docs = _docs("base")
    pdbs = [
        d["spec"]["selector"]["matchLabels"] for d in docs if d["kind"] == "PodDisruptionBudget"
    ]
    for dep in (d for d in docs if d["kind"] == "Deployment"):
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert any(all(labels.get(k) == v for k, v in sel.items()) for sel in pdbs), dep
    policy = _by(docs, "NetworkPolicy", "vllm-from-workers-and-prometheus")
    assert policy["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "vllm"}


def test_secrets_are_only_referenced() -> None:
    docs = _docs("overlays/all-options")
    assert not [d for d in docs if d["kind"] == "Secret"]
    text = yaml.safe_dump_all(docs)
    assert "tiergate-secrets" in text


def test_manifest_files_parse(tmp_path: Path) -> None:
    for path in K8S.rglob("*.yaml"):
        list(yaml.safe_load_all(path.read_text(encoding="utf-8")))


@pytest.mark.parametrize("tree", TREES)
def test_gateway_capacity_is_per_pod_seqs_times_max_pods(tree: str) -> None:
    docs = _docs(tree)
    config = yaml.safe_load(_by(docs, "ConfigMap", "tiergate-config")["data"]["config.yaml"])
    capacity = {
        r["url"].split("//")[1].split(":")[0]: r["max_num_seqs"]
        for d in config["deployments"]
        for r in d.get("replicas", [])
    }
    for name, seqs_total in capacity.items():
        args = _pool(docs, name)["containers"][0]["args"]
        per_pod = next(int(a.split("=")[1]) for a in args if a.startswith("--max-num-seqs="))
        pods = _by(docs, "ScaledObject", name)["spec"]["maxReplicaCount"]
        assert seqs_total == per_pod * pods, name
