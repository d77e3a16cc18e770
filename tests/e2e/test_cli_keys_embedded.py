"""Key changes made with the CLI reach a running gateway at once when it runs on the embedded
Redis (no ``redis.url``): the CLI finds that Redis in ``redis.embedded_dir`` and announces the
change there, as the admin API does. With no gateway running, the CLI says when the change
applies. A real ``tiergate serve`` on its embedded ``redis-server``, SQLite, the CLI as a
process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support import TEST_KEYS, free_port, gateway_config, start_gateway, wait_ready


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, **TEST_KEYS},
    )  # fmt: skip


def _status(base: str, key: str) -> int:
    headers = {"authorization": f"Bearer {key}"}
    return httpx.get(f"{base}/v1/models", headers=headers, timeout=5).status_code


def test_a_key_revoked_with_the_cli_is_refused_within_a_second(tmp_path: Path) -> None:
    port, admin = free_port(), free_port()
    config = gateway_config(
        workdir=tmp_path, redis_url="unused", prefix="tg",
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}",
        sim_ports={"llama-3.1-8b-instruct": free_port()}, port=port, admin_port=admin,
        redis={"key_prefix": "tg", "embedded_dir": str(tmp_path / "redis")},
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    gateway = start_gateway(config, tmp_path)
    try:
        wait_ready(gateway, f"{base}/healthz")
        created = _cli("keys", "create", "--config", str(config),
                       "--principal", "bob", "--role", "tenant:acme")  # fmt: skip
        assert created.returncode == 0, created.stderr
        assert "no gateway runs" not in created.stderr
        issued = json.loads(created.stdout)
        assert _status(base, issued["key"]) == 200  # announced: usable at once

        revoked = _cli("keys", "revoke", "--config", str(config), issued["key_id"])
        assert revoked.returncode == 0, revoked.stderr
        done = time.monotonic()
        while _status(base, issued["key"]) != 401:
            assert time.monotonic() - done < 1.0, "still accepted a second after the revoke"
            time.sleep(0.05)
    finally:
        gateway.stop()

    # No gateway runs on that Redis now: the CLI says when a change applies.
    later = _cli("keys", "create", "--config", str(config),
                 "--principal", "carol", "--role", "tenant:acme")  # fmt: skip
    assert later.returncode == 0, later.stderr
    assert "no gateway runs an embedded Redis" in later.stderr
    assert "within 30 s" in later.stderr
