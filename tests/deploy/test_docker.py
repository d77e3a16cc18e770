"""The compose stack against the Compose Specification schema; the image's install layer and
runtime lock; the compose configs load as tiergate settings."""

from __future__ import annotations

import re
import tomllib

import jsonschema
import pytest
import yaml

from gateway.settings import load_settings
from tests.deploy.conftest import DEPLOY, ROOT, load_schema

DOCKER = DEPLOY / "docker"


def _compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text(encoding="utf-8"))


def test_compose_file_matches_the_compose_spec_schema() -> None:
    schema = load_schema("compose-spec.json")
    validator = jsonschema.Draft201909Validator(schema)
    errors = sorted(validator.iter_errors(_compose()), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]


def test_the_schema_rejects_a_misspelt_key() -> None:
    compose = _compose()
    compose["services"]["redis"]["restrat"] = "always"
    validator = jsonschema.Draft201909Validator(load_schema("compose-spec.json"))
    assert list(validator.iter_errors(compose))


def test_profiles_gpu_pools_and_simulators() -> None:
    services = _compose()["services"]
    gpu = {n for n, s in services.items() if "gpu" in s.get("profiles", [])}
    sim = {n for n, s in services.items() if "sim" in s.get("profiles", [])}
    assert gpu == {"vllm-8b", "vllm-70b"}
    assert sim == {"sim-8b", "sim-70b", "sim-external"}
    for name in gpu:
        service = services[name]
        assert re.fullmatch(r"vllm/vllm-openai:v\d+\.\d+\.\d+", service["image"])
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"]
    flags_70b = services["vllm-70b"]["command"]
    for flag in (
        "--quantization=awq_marlin",
        "--max-model-len=8192",
        "--gpu-memory-utilization=0.92",
        "--max-num-seqs=64",
        "--enable-prefix-caching",
        "--tensor-parallel-size=2",
    ):
        assert flag in flags_70b
    assert services["vllm-70b"]["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 2
    # the same host names on the network whichever profile runs
    for real, fake in (("vllm-8b", "sim-8b"), ("vllm-70b", "sim-70b")):
        assert (
            services[real]["networks"]["default"]["aliases"]
            == services[fake]["networks"]["default"]["aliases"]
        )


def test_redis_persists_and_postgres_keeps_its_data() -> None:
    services = _compose()["services"]
    command = services["redis"]["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--appendfsync") + 1] == "everysec"
    assert any(v.endswith(":/data") for v in services["redis"]["volumes"])
    assert any("/var/lib/postgresql/data" in v for v in services["postgres"]["volumes"])


@pytest.mark.parametrize("name", ["config.yaml", "config.sim.yaml"])
def test_compose_configs_load(name: str) -> None:
    settings = load_settings(DOCKER / name)
    assert {d.tier.value for d in settings.deployments} == {"small", "large", "external"}
    assert settings.server.host == "0.0.0.0"


def test_dockerfile_installs_the_lock_with_hashes_runs_as_non_root_under_tini() -> None:
    text = (DOCKER / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"pip install --require-hashes --no-deps .*-r /tmp/requirements\.lock", text)
    user = re.findall(r"^USER (\S+)", text, re.M)
    assert user and not user[-1].startswith(("0", "root"))
    entry = re.findall(r"^ENTRYPOINT (.+)$", text, re.M)[-1]
    assert entry.startswith('["/usr/bin/tini", "--"')  # exec form, tini forwards SIGTERM


def _pins(path) -> dict[str, str]:
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-\[\]]+)==(\S+)", line)
        if match:
            pins[re.sub(r"\[.*\]", "", match.group(1)).lower()] = match.group(2)
    return pins


def test_runtime_lock_agrees_with_the_project_lock() -> None:
    runtime = _pins(DOCKER / "requirements.lock")
    full = _pins(ROOT / "requirements.lock")
    assert {name: v for name, v in runtime.items() if full.get(name) != v} == {}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for requirement in project["dependencies"]:
        name = re.split(r"[\[<>=!~ ;]", requirement, maxsplit=1)[0].lower()
        assert name in runtime, f"{name} missing: regenerate deploy/docker/requirements.lock"


def test_the_base_image_is_pinned_by_digest() -> None:
    text = (DOCKER / "Dockerfile").read_text(encoding="utf-8")
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M)
    assert base and re.fullmatch(r"python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", base[1])
    assert re.findall(r"^FROM (\S+)", text, re.M) == ["${PYTHON_IMAGE}"] * 2


TRAINING = {"scikit-learn", "scipy", "numpy", "skops", "threadpoolctl", "joblib"}


def test_the_runtime_image_has_no_training_libraries() -> None:
    """The serving path imports none of them (tests/gateway/test_serving_imports.py); they are
    the ``train`` extra, in the project lock and not in the image's."""
    assert not TRAINING & set(_pins(DOCKER / "requirements.lock"))
    assert set(_pins(ROOT / "requirements.lock")) >= TRAINING
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = {re.split(r"[\[<>=!~ ;]", r, maxsplit=1)[0].lower() for r in project["dependencies"]}
    assert not TRAINING & names
    assert {"scikit-learn", "skops"} <= {
        re.split(r"[\[<>=!~ ;]", r, maxsplit=1)[0].lower()
        for r in project["optional-dependencies"]["train"]
    }
