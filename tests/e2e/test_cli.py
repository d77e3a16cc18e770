"""The commands operators run: `tiergate up` (embedded Redis, simulators; the official openai
client streams through it), `serve`'s key check, `report` and `ledger show`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests.support import TEST_KEYS, Proc, free_port, wait_ready

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "config.example.yaml"
KEY_VARS = tuple(TEST_KEYS)


def _config_on_free_ports(tmp_path: Path) -> tuple[Path, dict[str, int]]:
    config = yaml.safe_load(EXAMPLE.read_text())
    ports = {"public": free_port(), "admin": free_port()}
    config["server"] = {"host": "127.0.0.1", "port": ports["public"], "admin_port": ports["admin"]}
    config["database"] = {"url": f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"}
    config.setdefault("redis", {})["embedded_dir"] = str(tmp_path / "redis")
    by_port: dict[int, int] = {}
    for sim in config["simulators"]:
        by_port[sim["port"]] = sim["port"] = free_port()
    for dep in config["deployments"]:
        url: str = dep["replicas"][0]["url"]
        old = int(url.split(":")[2].split("/")[0])
        dep["replicas"][0]["url"] = url.replace(f":{old}", f":{by_port[old]}")
    ports.update({f"sim{i}": p for i, p in enumerate(by_port.values())})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert "redis" not in config or not config["redis"].get("url")  # embedded Redis
    return path, ports


def _tiergate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def _closed(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


# Starts `tiergate up` and then runs the CLI eight times, each a process importing the gateway
# (litellm among it: 7-12 s): 35-55 s on a loaded 2-core machine, too close to the default 60 s.
@pytest.mark.timeout(180)
def test_up_serves_then_stops_everything_on_sigterm(tmp_path: Path) -> None:
    config, ports = _config_on_free_ports(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in KEY_VARS}
    # No key variables set: `up` runs with the documented development keys.
    up = Proc(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "up",
            "--config",
            str(config),
            "--time-scale",
            "0.05",
        ],
        tmp_path / "up.log",
        env={k: "" for k in KEY_VARS},
    )
    try:
        started = time.monotonic()
        wait_ready(up, f"http://127.0.0.1:{ports['public']}/readyz", 60)
        assert time.monotonic() - started < 60
        response = httpx.post(
            f"http://127.0.0.1:{ports['public']}/v1/chat/completions",
            headers={"authorization": "Bearer dev-acme"},
            json={"model": "small", "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        )
        assert response.status_code == 200, response.text
        request_id = response.headers["x-request-id"]
        streamed = _openai_stream(f"http://127.0.0.1:{ports['public']}/v1")
        metrics = httpx.get(f"http://127.0.0.1:{ports['admin']}/metrics", timeout=5)
        assert "tiergate_requests_total" in metrics.text
        # The banner names the pages, and they are served where it says.
        rules_page = f"http://127.0.0.1:{ports['public']}/dashboard/rules"
        assert rules_page in up.output()
        assert "tiergate rules" in httpx.get(rules_page, timeout=5).text
        # It says where the cost dashboard is, and the page is there.
        dashboard = f"http://127.0.0.1:{ports['public']}/dashboard"
        assert dashboard in up.output()
        assert httpx.get(dashboard, timeout=5).status_code == 200
    finally:
        up.popen.send_signal(signal.SIGTERM)
        stopping = time.monotonic()
        code = up.popen.wait(timeout=15)
        stopped_in = time.monotonic() - stopping
        up.stop()
    assert stopped_in < 10, f"took {stopped_in:.1f}s to stop:\n{up.output()}"
    assert code == 0, up.output()
    assert all(_closed(port) for port in ports.values()), "something still listens"

    # The ledger, read from the command line.
    shown = _tiergate(
        "ledger", "show", "--config", str(config), "--request-id", request_id, env=env
    )
    assert shown.returncode == 0, shown.stderr
    row = json.loads(shown.stdout)
    assert row["request_id"] == request_id and row["tenant"] == "acme" and row["outcome"] == "ok"
    # the streamed request's row: real token counts, the cost its final chunk carried
    shown = _tiergate(
        "ledger", "show", "--config", str(config), "--request-id", streamed["id"], env=env
    )
    assert shown.returncode == 0, shown.stderr
    srow = json.loads(shown.stdout)
    assert srow["stream"] is True and srow["outcome"] == "ok"
    assert (srow["prompt_tokens"], srow["completion_tokens"]) == streamed["tokens"]
    assert Decimal(srow["cost_nano_usd"]).scaleb(-9) == streamed["cost"] > 0
    report = _tiergate(
        "report", "--config", str(config), "--tenant", "acme", "--format", "json", env=env
    )
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    assert data["totals"]["requests"] == 2
    assert data["totals"]["prompt_tokens"] == row["prompt_tokens"] + srow["prompt_tokens"]
    other = _tiergate(
        "report", "--config", str(config), "--tenant", "globex", "--format", "json", env=env
    )
    assert json.loads(other.stdout)["totals"]["requests"] == 0
    csv = _tiergate(
        "report", "--config", str(config), "--tenant", "acme", "--format", "csv", env=env
    )
    assert csv.returncode == 0 and "llama-3.1-8b-instruct" in csv.stdout
    missing = _tiergate(
        "ledger", "show", "--config", str(config), "--request-id", "req_nope", env=env
    )
    assert missing.returncode == 1


def _openai_stream(base_url: str) -> dict[str, Any]:
    """One streamed request through the official client (development key), with usage."""
    with openai.OpenAI(base_url=base_url, api_key="dev-acme", max_retries=0, timeout=30) as api:
        raw = api.chat.completions.with_raw_response.create(
            model="auto",
            messages=[{"role": "user", "content": "Write a haiku about autumn."}],
            stream=True,
            stream_options={"include_usage": True},
        )
        assert raw.headers["x-tiergate-tier"] in {"small", "large"}
        text, usage, extra = [], None, None
        for chunk in raw.parse():
            text += [c.delta.content or "" for c in chunk.choices]
            if chunk.usage is not None:
                usage, extra = chunk.usage, chunk.model_extra
    assert "".join(text)
    assert usage is not None and usage.completion_tokens > 0
    assert extra is not None
    return {
        "id": raw.headers["x-request-id"],
        "tokens": (usage.prompt_tokens, usage.completion_tokens),
        "cost": Decimal(extra["x_tiergate"]["cost_usd"]),
    }


def test_serve_refuses_unset_keys_without_dev(tmp_path: Path) -> None:
    config, _ports = _config_on_free_ports(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in KEY_VARS}
    result = _tiergate("serve", "--config", str(config), env=env)
    assert result.returncode == 2
    assert "TIERGATE_KEY_ACME" in result.stderr and "--dev" in result.stderr
