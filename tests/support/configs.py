"""Gateway configs for tests, made from ``deploy/config.example.yaml``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.support.ports import free_port

__all__ = [
    "EXAMPLE_CONFIG",
    "edit_config",
    "example_config_on_free_ports",
    "gateway_config",
    "own_config",
]

EXAMPLE_CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "config.example.yaml"


def example_config_on_free_ports(tmp_path: Path) -> tuple[Path, dict[str, int]]:
    """The example config (what ``make demo`` runs) with its gateway, admin port and simulators
    moved to free ports; its path and the ports by name (``gateway``, ``admin port``,
    ``simulator <profile>``)."""
    config = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    ports = {"gateway": free_port(), "admin port": free_port()}
    config["server"] = {"host": "127.0.0.1", "port": ports["gateway"],
                        "admin_port": ports["admin port"]}  # fmt: skip
    by_port: dict[int, int] = {}
    for sim in config["simulators"]:
        by_port[sim["port"]] = sim["port"] = ports[f"simulator {sim['profile']}"] = free_port()
    for dep in config["deployments"]:
        url: str = dep["replicas"][0]["url"]
        old = int(url.split(":")[2].split("/")[0])
        dep["replicas"][0]["url"] = url.replace(f":{old}", f":{by_port[old]}")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, ports


def gateway_config(
    *,
    workdir: Path,
    redis_url: str,
    prefix: str,
    database_url: str,
    sim_ports: Mapping[str, int],
    port: int,
    admin_port: int,
    **extra: Any,
) -> Path:
    """A config like deploy/config.example.yaml, on the given ports and stores, with only the
    deployments that have a simulator in ``sim_ports``."""
    config = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    config["server"] = {"host": "127.0.0.1", "port": port, "admin_port": admin_port}
    config["redis"] = {"url": redis_url, "key_prefix": prefix}
    config["database"] = {"url": database_url}
    config.pop("simulators", None)
    config["deployments"] = [d for d in config["deployments"] if d["model"] in sim_ports]
    for tenant in config["tenants"].values():
        if tenant.get("baseline_model") not in sim_ports:
            tenant.pop("baseline_model", None)
    for dep in config["deployments"]:
        sim_port = sim_ports[dep["model"]]
        suffix = "/v1" if dep["provider"] == "litellm" else ""
        dep["replicas"][0]["url"] = f"http://127.0.0.1:{sim_port}{suffix}"
    for key, value in extra.items():
        config[key] = value
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def edit_config(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite the YAML config at ``path`` with ``edit`` applied to its data."""
    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data))


def own_config(config: Path, workdir: Path, name: str, **sections: Mapping[str, Any]) -> Path:
    """A copy of ``config`` for one more process beside the others (in ``workdir/name``, which
    it makes), each given section's settings updated: ``server={"admin_port": free_port()}``."""
    own = workdir / name
    own.mkdir()
    data = yaml.safe_load(config.read_text())
    for section, values in sections.items():
        data.setdefault(section, {}).update(values)
    path = own / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path
