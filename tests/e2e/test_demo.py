"""``tiergate demo`` (what ``make demo`` runs) checks that the stack it talks to is its own: with
one of its ports taken it stops at once with a message naming the port and exits non-zero; it
exits non-zero when a request failed or a ledger row is missing. And ``tiergate serve`` says it
listens only once its ports are bound. Real processes, a real Redis for ``serve``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gateway.cli.demo_cmd import _incomplete, _Result
from gateway.cli.demo_prompts import DEMO_TRAFFIC
from tests.support import (
    TEST_KEYS,
    example_config_on_free_ports,
    free_port,
    gateway_config,
    new_prefix,
)


@contextmanager
def occupied(port: int) -> Iterator[None]:
    """Something else listening on ``port`` (and answering whatever it is asked)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        yield


def _run(args: list[str], cwd: Path, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        cwd=cwd, capture_output=True, text=True, timeout=timeout_s, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("which", ["gateway", "admin port", "simulator gpt-4o-mini"])
def test_the_demo_with_a_port_taken_says_which_and_exits_non_zero(
    tmp_path: Path, which: str
) -> None:
    config, ports = example_config_on_free_ports(tmp_path)
    with occupied(ports[which]):
        result = _run(["demo", "--config", str(config)], tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert f"127.0.0.1:{ports[which]} ({which})" in out and "already in use" in out, out
    assert "sending" not in out  # no traffic to a stranger
    assert not (tmp_path / "var").exists()  # nothing started


def test_up_with_a_port_taken_says_which_and_exits_non_zero(tmp_path: Path) -> None:
    config, ports = example_config_on_free_ports(tmp_path)
    with occupied(ports["simulator llama-3.1-8b-instruct"]):
        result = _run(["up", "--config", str(config)], tmp_path)
    assert result.returncode == 1
    assert f"{ports['simulator llama-3.1-8b-instruct']} (simulator" in result.stderr


def test_serve_logs_listening_only_once_bound(tmp_path: Path, redis_url: str) -> None:
    port, admin = free_port(), free_port()
    config = gateway_config(
        workdir=tmp_path, redis_url=redis_url, prefix=new_prefix(),
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}",
        sim_ports={"llama-3.1-8b-instruct": free_port()}, port=port, admin_port=admin,
    )  # fmt: skip
    with occupied(admin):
        result = subprocess.run(
            [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config)],
            cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
            env={**os.environ, **TEST_KEYS},
        )  # fmt: skip
    log = result.stdout + result.stderr
    assert result.returncode != 0, log
    assert "address already in use" in log.lower(), log
    assert "listening" not in log, log


def _result(i: int, *, error: str | None = None) -> _Result:
    return _Result(DEMO_TRAFFIC[i], f"req_{i}", "small", "auto", "m", 1.0, error)


@pytest.mark.parametrize(
    ("results", "booked", "problem"),
    [
        ([_result(0), _result(1)], {"req_0", "req_1"}, None),
        ([_result(0), _result(1, error="boom")], {"req_0"}, "1 of 2 requests failed"),
        ([_result(0), _result(1)], {"req_0"}, "1 ledger rows missing"),
        ([], set(), "0 of 0 requests failed"),
    ],
)
def test_the_demo_is_incomplete_when_a_request_failed_or_a_row_is_missing(
    results: list[_Result], booked: set[str], problem: str | None
) -> None:
    verdict = _incomplete(results, booked)
    if problem is None:
        assert verdict is None
    else:
        assert verdict is not None and problem in verdict
