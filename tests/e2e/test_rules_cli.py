"""`tiergate rules`: validate, apply, history, rollback, explain (against a SQLite store)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gateway.cli.main import app

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "config.example.yaml"
RULES = Path(__file__).resolve().parents[2] / "deploy" / "rules"


@pytest.fixture
def config(tmp_path: Path, redis_url: str, key_prefix: str) -> Path:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["database"] = {"url": f"sqlite+aiosqlite:///{tmp_path / 'tiergate.db'}"}
    data["redis"] = {"url": redis_url, "key_prefix": key_prefix}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["rules", *args])
    return result.exit_code, result.output


def test_validate_reports_the_line(tmp_path: Path) -> None:
    code, out = run("validate", str(RULES / "code-review.yaml"))
    assert code == 0 and "ok, 2 rules" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - id: x\n    then:\n      max_tokens: -1\n")
    code, out = run("validate", str(bad))
    assert code == 1
    assert "line 4: rules[0].then.max_tokens" in out


def test_validate_checks_deployments_with_a_config(tmp_path: Path, config: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - id: x\n    then: {deployment: gpt-9}\n")
    assert run("validate", str(bad))[0] == 0
    code, out = run("validate", str(bad), "--config", str(config))
    assert code == 1 and "line 3" in out and "unknown deployment 'gpt-9'" in out


def test_apply_history_rollback_explain(tmp_path: Path, config: Path) -> None:
    code, out = run("apply", str(RULES / "code-review.yaml"), "--tenant", "acme", "-c",
                    str(config), "--author", "alice")  # fmt: skip
    assert code == 0, out
    assert "acme v1 by alice" in out
    code, out = run("apply", str(RULES / "per-app-quality.yaml"), "--tenant", "acme", "-c",
                    str(config))  # fmt: skip
    assert "acme v2 by cli" in out
    code, out = run("explain", "--tenant", "acme", "-c", str(config),
                    "--prompt", "please review my diff")  # fmt: skip
    assert code == 0, out
    assert json.loads(out)["rule"] != "rule:code-review-large"

    code, out = run("rollback", "--tenant", "acme", "-c", str(config), "--to", "1")
    assert code == 0 and "acme v3" in out and "(rollback)" in out
    code, out = run("explain", "--tenant", "acme", "-c", str(config),
                    "--prompt", "please review my diff")  # fmt: skip
    plan = json.loads(out)
    assert (plan["rule"], plan["tier"]) == ("rule:code-review-large", "large")

    code, out = run("history", "--tenant", "acme", "-c", str(config), "--diff")
    assert code == 0
    lines = [line for line in out.splitlines() if line.startswith("v")]
    assert [line.split("\t")[0] for line in lines[:3]] == ["v1", "v2", "v3"]
    assert "rollback of v1" in out and "+++ v3" in out
    assert run("rollback", "--tenant", "acme", "-c", str(config), "--to", "9")[0] == 1


def test_explain_a_file_before_shipping(config: Path) -> None:
    pii = str(RULES / "pii-on-prem.yaml")
    code, out = run("explain", "--tenant", "acme", "-c", str(config), "--rules", pii,
                    "--tags", "pii", "--prompt", "hello")  # fmt: skip
    assert code == 0, out
    plan = json.loads(out)
    assert plan["rule"] == "rule:pii-on-prem"
    assert "gpt-4o-mini" not in plan["deployments"]


def test_explain_shows_a_deadline_spill_for_a_given_wait(tmp_path: Path, config: Path) -> None:
    """No live signals in the CLI: ``--wait`` supplies the large tier's, ``--timeout-ms`` the
    request's time left (default: the config's default timeout)."""
    rules = tmp_path / "all-large.yaml"
    rules.write_text("rules:\n  - id: all-large\n    then: {threshold: 0}\n")
    args = ("explain", "--tenant", "acme", "-c", str(config), "--rules", str(rules),
            "--prompt", "hello", "--wait", "large=12")  # fmt: skip
    code, out = run(*args)
    assert code == 0, out
    plan = json.loads(out)
    assert (plan["tier"], plan["rule"], plan["timeout_ms"]) == ("large", "rule:all-large", 120_000)
    code, out = run(*args, "--timeout-ms", "5000")
    assert code == 0, out
    plan = json.loads(out)
    assert (plan["tier"], plan["rule"], plan["timeout_ms"]) == ("external", "spill:deadline", 5000)
    assert "deadline in 5.0 s: large tier's expected wait 12.0 s does not fit" in plan["reason"]
    code, out = run(*args, "--wait", "huge=3")
    assert code == 2 and "TIER=SECONDS" in out


def test_apply_refuses_invalid_rules_and_unknown_tenants(tmp_path: Path, config: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules: 5\n")
    code, out = run("apply", str(bad), "--tenant", "acme", "-c", str(config))
    assert code == 1 and "line 1" in out
    code, out = run("apply", str(RULES / "free-plan.yaml"), "--tenant", "nobody", "-c",
                    str(config))  # fmt: skip
    assert code == 2 and "unknown tenant" in out
    assert "no rules versions" in run("history", "--tenant", "acme", "-c", str(config))[1]
