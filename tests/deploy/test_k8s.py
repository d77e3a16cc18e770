"""deploy/k8s rendered (base, production, every switch on): core kinds against the Kubernetes
schemas with ``kubernetes-validate`` (strict: unknown fields fail), KEDA objects against the
ScaledObject CRD schema, and the properties the issue asks of the pools."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import redis
import yaml

from gateway.services import build_catalog
from gateway.settings import Settings
from router.catalog import Tier
from tests.deploy.conftest import DEPLOY, crd_errors
from tests.deploy.kustomize import render
from tests.support import free_port

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


def _queries(obj: dict[str, Any]) -> dict[str, str]:
    return {
        t["name"]: t["metadata"]["query"]
        for t in obj["spec"]["triggers"]
        if t["type"] == "prometheus"
    }


def test_every_scaledobject_targets_a_deployment_and_pools_scale_on_vllm_waiting() -> None:
    docs = _docs("base")
    deployments = {d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"}
    for obj in (d for d in docs if d["kind"] == "ScaledObject"):
        assert obj["spec"]["scaleTargetRef"]["name"] in deployments
        if not obj["metadata"]["name"].startswith("vllm-"):
            continue
        assert any("vllm:num_requests_waiting" in q for q in _queries(obj).values())
        if obj["spec"]["minReplicaCount"] == 0:
            # wake from zero: a signal from outside the engine, with activation at 0
            wake = [t for t in obj["spec"]["triggers"] if "tiergate_" in t["metadata"]["query"]]
            assert wake and all(t["metadata"]["activationThreshold"] == "0" for t in wake)


def test_on_demand_grows_only_when_spot_cannot() -> None:
    """Spot wakes and grows on the tier's planned traffic and backlog; on-demand, always up,
    does not: it grows on the load that overflows onto its own engines, and on backlog only
    once it has waited longer than spot takes to add a pod."""
    docs = _docs("base")
    spot = _queries(_by(docs, "ScaledObject", "vllm-llama-8b-spot"))
    ondemand = _queries(_by(docs, "ScaledObject", "vllm-llama-8b"))
    assert any("tiergate_route_decisions_total" in q for q in spot.values())
    assert not any("tiergate_route_decisions_total" in q for q in ondemand.values())
    backlog = [q for q in ondemand.values() if "tiergate_queue_depth" in q]
    assert backlog and all("tiergate_queue_oldest_job_age_seconds" in q for q in backlog)
    for query in ondemand.values():
        if "vllm:" in query:
            assert 'model_name="llama-3.1-8b-instruct"' in query


def test_workers_scale_on_calls_in_flight_and_cpu_not_on_backlog() -> None:
    worker = _by(_docs("base"), "ScaledObject", "tiergate-worker")
    kinds = {t["type"] for t in worker["spec"]["triggers"]}
    assert kinds == {"prometheus", "cpu"}
    assert not any("tiergate_queue_depth" in q for q in _queries(worker).values())
    assert any("tiergate_inflight_requests" in q for q in _queries(worker).values())
    assert worker["spec"]["minReplicaCount"] >= 2


def _pool(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return _by(docs, "Deployment", name)["spec"]["template"]["spec"]


@pytest.mark.parametrize(
    ("name", "startup_s"),
    [("vllm-llama-8b-spot", 600), ("vllm-llama-8b", 600), ("vllm-llama-70b-awq", 1200)],
)
def test_vllm_pools_probe_drain_and_mount_shm_and_weights(name: str, startup_s: int) -> None:
    spec = _pool(_docs("base"), name)
    container = spec["containers"][0]
    assert container["image"] == "vllm/vllm-openai:v0.33.0"
    for probe in ("startupProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert 0 < container[probe]["timeoutSeconds"] <= container[probe]["periodSeconds"]
    # liveness: /health and a stuck engine (the script in ConfigMap vllm-probes)
    liveness = container["livenessProbe"]["exec"]["command"]
    assert liveness[:2] == ["python3", "/probes/engine_progress.py"]
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= startup_s
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    shutdown = next(
        int(a.split("=")[1]) for a in container["args"] if a.startswith("--shutdown-timeout=")
    )
    assert spec["terminationGracePeriodSeconds"] >= pre_stop + shutdown
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert "emptyDir" in volumes["models"]  # node-local: no network file system
    assert volumes["probes"]["configMap"]["name"] == "vllm-probes"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/dev/shm", "/models", "/root/.cache/vllm", "/probes"} <= mounts
    # the weights the engine loads are the ones the init container synced from the store
    fetch = next(c for c in spec["initContainers"] if c["name"] == "fetch-weights")
    source, target = fetch["args"][-2:]
    assert container["args"][0] == "/models/" + source.removeprefix("$(MODEL_STORE)/")[:-2]
    assert target == container["args"][0] + "/"
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in container["env"]


def test_the_engine_progress_script_is_the_one_in_the_repository() -> None:
    probes = _by(_docs("base"), "ConfigMap", "vllm-probes")["data"]["engine_progress.py"]
    assert probes == (K8S / "base" / "probes" / "engine_progress.py").read_text(encoding="utf-8")


def test_70b_pool_runs_awq_marlin_on_two_gpus() -> None:
    container = _pool(_docs("base"), "vllm-llama-70b-awq")["containers"][0]
    assert "--quantization=awq_marlin" in container["args"]
    assert "--tensor-parallel-size=2" in container["args"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"


def _arg(args: list[str], flag: str) -> str:
    return next(a.split("=", 1)[1] for a in args if a.startswith(flag + "="))


def test_switches_change_only_what_they_claim() -> None:
    base, options = _docs("base"), _docs("overlays/all-options")
    args_70b = _pool(options, "vllm-llama-70b-awq")["containers"][0]["args"]
    assert any(a.startswith("--speculative-config=") for a in args_70b)
    ondemand = _pool(options, "vllm-llama-8b")["containers"][0]
    assert ondemand["resources"]["limits"] == {"memory": "32Gi", "nvidia.com/mig-3g.40gb": "1"}
    assert "--max-num-seqs=64" in ondemand["args"]
    spot, spot_base = _pool(options, "vllm-llama-8b-spot"), _pool(base, "vllm-llama-8b-spot")
    assert _arg(spot["containers"][0]["args"], "--shutdown-timeout") == "100"
    assert spot["terminationGracePeriodSeconds"] == 110
    spot_args = [a for a in spot["containers"][0]["args"] if "shutdown" not in a]
    assert spot_args == [a for a in spot_base["containers"][0]["args"] if "shutdown" not in a]


def test_speculative_decoding_is_configured_as_vllm_accepts_it() -> None:
    """vLLM's draft-model proposer refuses a draft tensor-parallel size other than the
    target's (``_raise_if_draft_tp_mismatch``); the draft's weights are synced like the
    target's (the pod has no Hugging Face token and runs offline)."""
    spec = _pool(_docs("overlays/all-options"), "vllm-llama-70b-awq")
    args = spec["containers"][0]["args"]
    config = json.loads(_arg(args, "--speculative-config"))
    assert config["method"] == "draft_model" and config["num_speculative_tokens"] >= 1
    assert config.get("draft_tensor_parallel_size", 2) == int(_arg(args, "--tensor-parallel-size"))
    synced = {c["args"][-1].rstrip("/") for c in spec["initContainers"]}
    assert config["model"] in synced


def test_mig_pods_see_one_device_by_index_and_tiergate_knows_their_slots() -> None:
    docs = _docs("overlays/all-options")
    ondemand = _pool(docs, "vllm-llama-8b")["containers"][0]
    assert {"name": "CUDA_VISIBLE_DEVICES", "value": "0"} in ondemand["env"]
    for name in ("tiergate-gateway", "tiergate-worker"):
        env = {e["name"]: e for e in _pool(docs, name)["containers"][0]["env"]}
        slots = json.loads(env["TIERGATE_KUBERNETES__POD_SLOTS"]["value"])
        assert slots == {"vllm-llama-8b": int(_arg(ondemand["args"], "--max-num-seqs"))}


def test_spot_drain_fits_the_reclaim_notice() -> None:
    """GKE gives a spot pod 15 s (base); AWS two minutes (components/spot-aws)."""
    for tree, notice_s in (("base", 15), ("overlays/all-options", 120)):
        spec = _pool(_docs(tree), "vllm-llama-8b-spot")
        container = spec["containers"][0]
        pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
        shutdown = int(_arg(container["args"], "--shutdown-timeout"))
        assert pre_stop + shutdown <= spec["terminationGracePeriodSeconds"] <= notice_s, tree


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
def test_each_pool_is_discovered_per_pod_with_its_pods_slots(tree: str) -> None:
    """Every vLLM deployment of the config follows its pool's pods: the Service it names exists,
    is headless (DNS mode works too) and selects the pool's pods, and the slots per pod
    (``discovery.max_num_seqs``, or ``kubernetes.pod_slots`` given to the gateway and workers)
    equal the pods' --max-num-seqs."""
    docs = _docs(tree)
    config = yaml.safe_load(_by(docs, "ConfigMap", "tiergate-config")["data"]["config.yaml"])
    env = {e["name"]: e for e in _pool(docs, "tiergate-worker")["containers"][0]["env"]}
    override = json.loads(env.get("TIERGATE_KUBERNETES__POD_SLOTS", {"value": "{}"})["value"])
    vllm = [d for d in config["deployments"] if d.get("provider", "vllm") == "vllm"]
    assert vllm and all("replicas" not in d for d in vllm)
    for dep in vllm:
        service = _by(docs, "Service", dep["discovery"]["service"])
        assert service["spec"]["clusterIP"] == "None"
        pool = service["spec"]["selector"]["tiergate.dev/pool"]
        args = _pool(docs, pool)["containers"][0]["args"]
        slots = override.get(service["metadata"]["name"], dep["discovery"]["max_num_seqs"])
        assert slots == int(_arg(args, "--max-num-seqs")), dep["model"]
        assert _arg(args, "--served-model-name") == dep["model"]
        port = dep["discovery"]["port"]
        assert port in {p["name"] for p in service["spec"]["ports"]}


def test_discovery_has_list_and_watch_of_endpointslices_and_nothing_else() -> None:
    docs = _docs("base")
    role = _by(docs, "Role", "tiergate-endpointslices")
    assert role["rules"] == [
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["list", "watch"],
        }
    ]
    binding = _by(docs, "RoleBinding", "tiergate-endpointslices")
    assert binding["roleRef"]["name"] == "tiergate-endpointslices"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tiergate"}]
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    for name in ("tiergate-gateway", "tiergate-worker"):
        spec = _pool(docs, name)
        assert spec["serviceAccountName"] == "tiergate"
        assert spec["automountServiceAccountToken"] is True
    assert _by(docs, "ServiceAccount", "vllm")["automountServiceAccountToken"] is False


def _secret_keys(container: dict[str, Any]) -> set[str]:
    assert "envFrom" not in container or not any("secretRef" in e for e in container["envFrom"]), (
        container["name"]
    )
    return {
        e["valueFrom"]["secretKeyRef"]["key"]
        for e in container.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    }


def test_each_container_gets_only_the_secrets_it_uses() -> None:
    docs = _docs("overlays/all-options")
    config = yaml.safe_load(_by(docs, "ConfigMap", "tiergate-config")["data"]["config.yaml"])
    keys = {t["key_env"] for t in config["tenants"].values()}
    keys |= {p["key_env"] for p in config["principals"]}
    stores = {"TIERGATE_REDIS__URL", "TIERGATE_DATABASE__URL"}
    backends = {d["api_key_env"] for d in config["deployments"] if d.get("api_key_env")}
    gateway = _secret_keys(_pool(docs, "tiergate-gateway")["containers"][0])
    assert gateway == keys | stores  # no provider, vLLM or Hugging Face key in the edge
    worker = _secret_keys(_pool(docs, "tiergate-worker")["containers"][0])
    assert worker == keys | stores | backends
    for pool in ("vllm-llama-8b-spot", "vllm-llama-8b", "vllm-llama-70b-awq"):
        assert _secret_keys(_pool(docs, pool)["containers"][0]) == {"TIERGATE_VLLM_API_KEY"}
    redis = _by(docs, "StatefulSet", "redis")["spec"]["template"]["spec"]["containers"][0]
    assert _secret_keys(redis) == {"REDIS_PASSWORD"}


def test_pools_that_may_run_one_pod_cannot_lose_it_to_a_drain() -> None:
    docs = _docs("base")
    floors = {
        d["spec"]["scaleTargetRef"]["name"]: d["spec"]["minReplicaCount"]
        for d in docs
        if d["kind"] == "ScaledObject"
    }
    for pdb in (d for d in docs if d["kind"] == "PodDisruptionBudget"):
        selector = pdb["spec"]["selector"]["matchLabels"]
        target = next(
            d
            for d in docs
            if d["kind"] == "Deployment"
            and all(
                d["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in selector.items()
            )
        )
        name = target["metadata"]["name"]
        assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
        if floors.get(name) == 0:
            continue  # may be at zero anyway (spot): the pool behind it covers a drain
        assert pdb["spec"].get("minAvailable", 0) >= 1 or pdb["spec"].get("maxUnavailable") == 0, (
            name
        )


def test_the_gateway_scales_with_an_hpa() -> None:
    docs = _docs("base")
    hpa = _by(docs, "HorizontalPodAutoscaler", "tiergate-gateway")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "tiergate-gateway",
    }
    assert hpa["spec"]["minReplicas"] >= 2
    gateway = _by(docs, "Deployment", "tiergate-gateway")
    assert "replicas" not in gateway["spec"]  # else every apply resets the HPA's count
    assert _pool(docs, "tiergate-gateway")["containers"][0]["resources"]["requests"]["cpu"]


@pytest.mark.parametrize("tree", TREES)
def test_redis_runs_with_aof_every_second_on_a_volume(tree: str) -> None:
    redis = _by(_docs(tree), "StatefulSet", "redis")["spec"]
    args = redis["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--appendfsync") + 1] == "everysec"
    assert redis["volumeClaimTemplates"], "AOF on the pod's own disk would die with the pod"


def test_redis_starts_with_its_password_off_the_command_line(tmp_path: Path) -> None:
    """The manifest's own command, run with a local redis-server: the password works, is in no
    process's command line, and memory is capped without eviction."""
    spec = _by(_docs("base"), "StatefulSet", "redis")["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert not any("PASSWORD" in a or "requirepass" in a for a in container["args"])
    script = container["command"][2].replace("/conf/", f"{tmp_path}/")
    port = free_port()
    args = [*container["args"], "--port", str(port), "--dir", str(tmp_path), "--save", ""]
    password = "s3cret-" + tmp_path.name
    proc = subprocess.Popen(
        [*container["command"][:2], script, *container["command"][3:], *args],
        env={"PATH": os.environ["PATH"], "REDIS_PASSWORD": password},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = redis.Redis(port=port, password=password, socket_timeout=2)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.05)
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port, password="wrong", socket_timeout=2).ping()
        assert client.config_get("maxmemory")["maxmemory"] == str(1536 * 1024 * 1024)
        assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        assert client.config_get("appendonly")["appendonly"] == "yes"
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert password.encode() not in cmdline
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes()
        assert password.encode() not in environ  # unset before exec
        assert (tmp_path / "redis.conf").stat().st_mode & 0o077 == 0
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
