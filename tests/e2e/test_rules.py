"""Routing rules end to end: two gateway processes on one Redis and one database, simulators,
the official openai client. Every condition and action through explain and real requests (the
ledger shows the rule), hot reload across processes, rollback, refusals, authorization."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from tests.support import (
    TEST_KEYS,
    Proc,
    drop_prefix,
    free_port,
    gateway_config,
    new_prefix,
    start_sim,
    wait_ready,
)
from tests.support.ledger import wait_entry

PROFILES = ("llama-3.1-8b-instruct", "llama-3.1-70b-instruct-awq", "gpt-4o-mini")
SMALL, LARGE, EXTERNAL = PROFILES
RULE_KEYS = {
    "TIERGATE_RULES_ACME_KEY": "test-key-rules-acme-6d21",
    "TIERGATE_RULES_GLOBEX_KEY": "test-key-rules-globex-b3f0",
}
KEYS = {**TEST_KEYS, **RULE_KEYS}
EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "rules"
EASY = "What is the capital of France?"

ALL_RULES = """
rules:
  - id: c-tenant
    when: {tenant: globex, tag: t-tenant}
    then: {tier: large}
  - id: c-app
    when: {app: billing}
    then: {tier: large}
  - id: c-tag
    when: {tag: [pii]}
    then: {forbid_external: true, continuation: false}
  - id: c-user
    when: {user: vip-1}
    then: {tier: large}
  - id: c-model
    when: {model: small, tag: t-model}
    then: {tier: large}
  - id: c-prompt
    when: {prompt_tokens: {gt: 1500}, tag: t-prompt}
    then: {tier: large}
  - id: c-turns
    when: {turns: {gte: 3}, tag: t-turns}
    then: {tier: large}
  - id: c-text
    when: {last_message: {regex: 'review (this|my) (PR|diff)', keywords: [audit]}}
    then: {tier: large}
  - id: c-score
    when: {score: {gte: 0.0}, tag: t-score}
    then: {tier: large}
  - id: c-score-never
    when: {score: {gt: 1.0}, tag: t-score-never}
    then: {tier: large}
  - id: c-time
    when: {time: {after: "00:00", before: "24:00", tz: Europe/Berlin}, tag: t-time}
    then: {tier: large}
  - id: c-wait
    when: {queue_wait_s: {large: {gte: 0}}, tag: t-wait}
    then: {tier: external}
  - id: c-circuit
    when: {circuit_open: [large], tag: t-circuit}
    then: {tier: external}
  - id: a-deployment
    when: {tag: a-deployment}
    then: {deployment: gpt-4o-mini}
  - id: a-threshold
    when: {tag: a-threshold}
    then: {threshold: 0.0}
  - id: a-share
    when: {tag: a-share}
    then: {target_large_share: 1.0}
  - id: a-forbid
    when: {tag: a-forbid}
    then: {forbid_tiers: [small]}
  - id: a-max-tokens
    when: {tag: a-max-tokens}
    then: {max_tokens: 5}
  - id: a-cost
    when: {tag: a-cost}
    then: {tier: large, max_cost_usd: "0.00005"}
  - id: a-priority
    when: {tag: a-priority}
    then: {priority: batch}
  - id: a-fallback
    when: {tag: a-fallback}
    then: {tier: large, fallback: []}
  - id: a-continuation
    when: {tag: a-continuation}
    then: {continuation: true}
  - id: go-large
    when: {tag: go-large}
    then: {tier: large}
  - id: let-go
    when: {tag: let-go}
    then: {sticky: false}
"""


@dataclass
class Rig:
    a: str
    b: str
    database_url: str
    prefix: str
    workdir: Path
    usage_logs: list[Path]


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Rig]:
    workdir = tmp_path_factory.mktemp("rules")
    prefix = new_prefix()
    procs: list[Proc] = []
    usage: list[Path] = []
    try:
        ports = {profile: free_port() for profile in PROFILES}
        for profile, port in ports.items():
            sim, log = start_sim(profile, port, workdir)
            procs.append(sim)
            usage.append(log)
        database_url = f"sqlite+aiosqlite:///{workdir / 'ledger.db'}"
        urls = []
        for name in ("a", "b"):
            port = free_port()
            config = gateway_config(
                workdir=workdir,
                redis_url=redis_url,
                prefix=prefix,
                database_url=database_url,
                sim_ports=ports,
                port=port,
                admin_port=free_port(),
                principals=[
                    {"name": "admin", "roles": ["admin"], "key_env": "TIERGATE_ADMIN_KEY"},
                    {
                        "name": "rules-acme",
                        "roles": ["rules:acme"],
                        "key_env": "TIERGATE_RULES_ACME_KEY",
                    },
                    {
                        "name": "rules-globex",
                        "roles": ["rules:globex"],
                        "key_env": "TIERGATE_RULES_GLOBEX_KEY",
                    },
                ],
                rules={"poll_interval_s": 0.5},
            )
            config = config.rename(workdir / f"config-{name}.yaml")
            args = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config)]
            if name == "b":
                args.append("--no-workers")
            proc = Proc(args, workdir / f"gateway-{name}.log", KEYS)
            procs.append(proc)
            wait_ready(proc, f"http://127.0.0.1:{port}/readyz")
            urls.append(f"http://127.0.0.1:{port}")
        yield Rig(urls[0], urls[1], database_url, prefix, workdir, usage)
    finally:
        for proc in reversed(procs):
            proc.stop()
        drop_prefix(redis_url, prefix)


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30) as client:
        yield client


def key(who: str) -> str:
    return {
        "acme": TEST_KEYS["TIERGATE_KEY_ACME"],
        "globex": TEST_KEYS["TIERGATE_KEY_GLOBEX"],
        "initech": TEST_KEYS["TIERGATE_KEY_INITECH"],
        "admin": TEST_KEYS["TIERGATE_ADMIN_KEY"],
        "rules-acme": RULE_KEYS["TIERGATE_RULES_ACME_KEY"],
        "rules-globex": RULE_KEYS["TIERGATE_RULES_GLOBEX_KEY"],
    }[who]


def auth(who: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key(who)}"}


async def put_rules(
    http: httpx.AsyncClient, base: str, tenant: str, source: str, who: str = "admin"
) -> httpx.Response:
    return await http.put(f"{base}/v1/rules/{tenant}", content=source, headers=auth(who))


async def explain(
    http: httpx.AsyncClient,
    base: str,
    body: dict[str, Any],
    *,
    who: str = "acme",
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    reply = await http.post(
        f"{base}/v1/route/explain", json=body, headers={**auth(who), **(headers or {})}
    )
    assert reply.status_code == 200, reply.text
    result: dict[str, Any] = reply.json()
    return result


def chat(content: str = EASY, **extra: Any) -> dict[str, Any]:
    return {"model": "auto", "messages": [{"role": "user", "content": content}], **extra}


# ---------- every condition and action, through explain and real requests ----------

LONG = "Explain this paragraph in detail please. " * 300
TURNS = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "and?"},
    {"role": "assistant", "content": "yes"},
    {"role": "user", "content": "so?"},
]

# (case, who, body, headers, rule that fires, tier of the first deployment)
CASES: list[tuple[str, str, dict[str, Any], dict[str, str], str, str]] = [
    ("tenant", "globex", chat(), {"x-tiergate-tags": "t-tenant"}, "rule:c-tenant", "large"),
    ("app", "acme", chat(), {"x-tiergate-app": "billing"}, "rule:c-app", "large"),
    ("app-metadata", "acme", chat(metadata={"app": "billing"}), {}, "rule:c-app", "large"),
    ("tag", "acme", chat(), {"x-tiergate-tags": "x,pii"}, "rule:c-tag", "small"),
    ("user", "acme", chat(user="vip-1"), {}, "rule:c-user", "large"),
    ("model", "acme", {**chat(), "model": "small"}, {"x-tiergate-tags": "t-model"},
     "rule:c-model", "large"),
    ("prompt", "acme", chat(LONG), {"x-tiergate-tags": "t-prompt"}, "rule:c-prompt", "large"),
    ("turns", "acme", {"model": "auto", "messages": TURNS}, {"x-tiergate-tags": "t-turns"},
     "rule:c-turns", "large"),
    ("regex", "acme", chat("please review this PR"), {}, "rule:c-text", "large"),
    ("keyword", "acme", chat("run an AUDIT of it"), {}, "rule:c-text", "large"),
    ("score", "acme", chat(), {"x-tiergate-tags": "t-score"}, "rule:c-score", "large"),
    ("time", "acme", chat(), {"x-tiergate-tags": "t-time"}, "rule:c-time", "large"),
    ("queue-wait", "acme", chat(), {"x-tiergate-tags": "t-wait"}, "rule:c-wait", "external"),
    ("deployment", "acme", chat(), {"x-tiergate-tags": "a-deployment"}, "rule:a-deployment",
     "external"),
    ("threshold", "acme", chat(), {"x-tiergate-tags": "a-threshold"}, "rule:a-threshold",
     "large"),
    ("share", "acme", chat(), {"x-tiergate-tags": "a-share"}, "rule:a-share", "large"),
    ("forbid", "acme", chat(), {"x-tiergate-tags": "a-forbid"}, "rule:a-forbid", "large"),
    ("max-tokens", "acme", chat(max_tokens=200), {"x-tiergate-tags": "a-max-tokens"},
     "rule:a-max-tokens", "small"),
    ("cost", "acme", chat(), {"x-tiergate-tags": "a-cost"}, "rule:a-cost", "small"),
    ("priority", "acme", chat(), {"x-tiergate-tags": "a-priority"}, "rule:a-priority", "small"),
    ("fallback", "acme", chat(), {"x-tiergate-tags": "a-fallback"}, "rule:a-fallback", "large"),
    ("continuation", "acme", chat(), {"x-tiergate-tags": "a-continuation"},
     "rule:a-continuation", "small"),
]  # fmt: skip


@pytest.fixture(scope="module")
def all_rules(rig: Rig) -> Rig:
    for tenant in ("acme", "globex"):
        reply = httpx.put(
            f"{rig.a}/v1/rules/{tenant}", content=ALL_RULES, headers=auth("admin"), timeout=30
        )
        assert reply.status_code == 200, reply.text
        version = reply.json()["version"]
        deadline = time.monotonic() + 5
        while True:  # the second process picks the change up (pub/sub) before the tests start
            seen = httpx.post(f"{rig.b}/v1/route/explain", json=chat(), headers=auth(tenant),
                              timeout=30).json()["rules_version"]  # fmt: skip
            if seen == version:
                break
            assert time.monotonic() < deadline, f"process b still at v{seen} of {tenant}"
            time.sleep(0.01)
    return rig


def check_action(case: str, plan: dict[str, Any]) -> None:
    deployments = plan["deployments"]
    if case == "tag":
        assert EXTERNAL not in deployments and plan["continuation"] is False
    elif case == "deployment":
        assert deployments[0] == EXTERNAL
    elif case == "forbid":
        assert SMALL not in deployments
    elif case == "max-tokens":
        assert plan["max_tokens"] == 5
    elif case == "cost":
        assert deployments == [SMALL] and plan["max_cost_usd"] == "0.00005"
    elif case == "priority":
        assert plan["priority"] == "batch"
    elif case == "fallback":
        assert deployments == [LARGE]
    elif case == "continuation":
        assert plan["continuation"] is True
    elif case == "share":  # acme has too few scored requests for its own curve yet
        assert plan["share_source"]["curve"] == "mix" and plan["share_source"]["share"] == 1.0
        assert "documented mix" in plan["reason"]
    if case != "share":
        assert plan["share_source"] is None


@pytest.mark.parametrize(("case", "who", "body", "headers", "rule", "tier"), CASES,
                         ids=[c[0] for c in CASES])  # fmt: skip
async def test_condition_or_action_through_explain_and_a_real_request(
    all_rules: Rig,
    http: httpx.AsyncClient,
    case: str,
    who: str,
    body: dict[str, Any],
    headers: dict[str, str],
    rule: str,
    tier: str,
) -> None:
    plan = await explain(http, all_rules.b, body, who=who, headers=headers)
    assert (plan["rule"], plan["tier"]) == (rule, tier), plan
    check_action(case, plan)
    fired = rule.removeprefix("rule:")
    assert fired not in [s["rule"] for s in plan["skipped_rules"]]
    assert all(s["why"] for s in plan["skipped_rules"])

    api = openai.AsyncOpenAI(base_url=f"{all_rules.a}/v1", api_key=key(who), max_retries=0)
    async with api:
        extra = {k: v for k, v in body.items() if k not in ("model", "messages")}
        raw = await api.chat.completions.with_raw_response.create(
            model=body["model"], messages=body["messages"], extra_headers=headers, **extra
        )
    completion = raw.parse()
    assert raw.headers["x-tiergate-rule"] == rule
    assert raw.headers["x-tiergate-tier"] == tier
    entry = await wait_entry(all_rules.database_url, raw.headers["x-request-id"])
    assert entry.rule == rule
    if case == "max-tokens":
        assert completion.usage is not None and completion.usage.completion_tokens <= 5


@pytest.mark.parametrize(
    ("headers", "body", "rule", "why"),
    [
        ({"x-tiergate-tags": "t-tenant"}, chat(), "c-tenant", "tenant 'acme' not in ['globex']"),
        ({"x-tiergate-app": "chat"}, chat(), "c-app", "app 'chat' not in ['billing']"),
        ({"x-tiergate-tags": "t-prompt"}, chat(), "c-prompt", "prompt_tokens: "),
        ({"x-tiergate-tags": "t-turns"}, chat(), "c-turns", "turns: 1 is not ≥ 3"),
        ({}, chat(), "c-text", "last_message: no match"),
        ({"x-tiergate-tags": "t-score-never"}, chat(), "c-score-never", "score: "),
        ({"x-tiergate-tags": "t-circuit"}, chat(), "c-circuit", "circuit_open: none of"),
    ],
)
async def test_conditions_that_do_not_hold_say_why(
    all_rules: Rig, http: httpx.AsyncClient, headers: dict[str, str], body: dict[str, Any],
    rule: str, why: str,
) -> None:  # fmt: skip
    plan = await explain(http, all_rules.a, body, headers=headers)
    reasons = {s["rule"]: s["why"] for s in plan["skipped_rules"]}
    assert why in reasons[rule], reasons


async def test_forbidden_external_refuses_a_pinned_external_model(
    all_rules: Rig, http: httpx.AsyncClient
) -> None:
    reply = await http.post(
        f"{all_rules.a}/v1/chat/completions",
        json={**chat(), "model": EXTERNAL},
        headers={**auth("acme"), "x-tiergate-tags": "pii"},
    )
    assert reply.status_code == 403
    assert reply.json()["error"]["code"] == "model_not_allowed"
    assert "rule c-tag" in reply.json()["error"]["message"]


async def test_conversation_stays_large_unless_a_rule_lets_it_go(
    all_rules: Rig, http: httpx.AsyncClient
) -> None:
    conversation = {"x-tiergate-conversation-id": f"conv-{uuid.uuid4().hex}"}
    go_large = {**auth("acme"), **conversation, "x-tiergate-tags": "go-large"}
    first = await http.post(
        f"{all_rules.a}/v1/chat/completions", json=chat("hard question"), headers=go_large
    )
    assert first.headers["x-tiergate-tier"] == "large"
    later = await http.post(f"{all_rules.b}/v1/chat/completions", json=chat(EASY),
                            headers={**auth("acme"), **conversation})  # fmt: skip
    assert later.status_code == 200, later.text
    assert (later.headers["x-tiergate-tier"], later.headers["x-tiergate-rule"]) == (
        "large", "sticky:conversation"
    )  # fmt: skip
    entry = await wait_entry(all_rules.database_url, later.headers["x-request-id"])
    assert entry.rule == "sticky:conversation"
    released = await explain(http, all_rules.a, chat(EASY),
                             headers={**conversation, "x-tiergate-tags": "let-go"})  # fmt: skip
    assert (released["tier"], released["rule"]) == ("small", "rule:let-go")
    other = await explain(http, all_rules.a, chat(EASY),
                          headers={"x-tiergate-conversation-id": "another"})  # fmt: skip
    assert other["tier"] == "small"
    # without a client id: the hash of the opening messages
    opening = [{"role": "user", "content": f"opening {uuid.uuid4().hex}"}]
    await http.post(f"{all_rules.a}/v1/chat/completions",
                    json={"model": "auto", "messages": opening},
                    headers={**auth("acme"), "x-tiergate-tags": "go-large"})  # fmt: skip
    turn2 = [*opening, {"role": "assistant", "content": "ok"}, {"role": "user", "content": EASY}]
    plan = await explain(http, all_rules.b, {"model": "auto", "messages": turn2})
    assert (plan["tier"], plan["rule"]) == ("large", "sticky:conversation")


async def test_explain_calls_no_model_and_writes_no_ledger_row(
    all_rules: Rig, http: httpx.AsyncClient
) -> None:
    def served() -> int:
        return sum(len(p.read_text().splitlines()) for p in all_rules.usage_logs if p.exists())

    async def ledger_rows() -> int:
        engine = create_async_engine(all_rules.database_url)
        try:
            async with engine.connect() as conn:
                return int(
                    (await conn.execute(text("SELECT count(*) FROM ledger_entries"))).scalar_one()
                )
        finally:
            await engine.dispose()

    await asyncio.sleep(1.0)  # let earlier requests' rows land
    before = (served(), await ledger_rows())
    for tags in ("a-deployment", "a-fallback", "go-large", ""):
        await explain(http, all_rules.a, chat(), headers={"x-tiergate-tags": tags})
    await asyncio.sleep(1.0)
    assert (served(), await ledger_rows()) == before


# ---------- hot reload, rollback, refusals ----------


async def _until(http: httpx.AsyncClient, base: str, rule: str, limit_s: float) -> float:
    started = time.monotonic()
    while True:
        plan = await explain(http, base, chat("propagation probe"), who="globex")
        if plan["rule"] == rule:
            return time.monotonic() - started
        assert time.monotonic() - started < limit_s, f"still {plan['rule']} after {limit_s}s"
        await asyncio.sleep(0.01)


async def test_change_in_one_process_routes_the_other_within_a_second_and_rollback(
    rig: Rig, http: httpx.AsyncClient
) -> None:
    v1 = "rules:\n  - id: first\n    then: {tier: large}\n"
    v2 = "rules:\n  - id: second\n    then: {tier: external}\n"
    first = await put_rules(http, rig.a, "globex", v1, who="rules-globex")
    assert first.status_code == 200, first.text
    number = first.json()["version"]
    await _until(http, rig.b, "rule:first", 5.0)
    before = await explain(http, rig.b, chat("propagation probe"), who="globex")

    started = time.monotonic()
    changed = await put_rules(http, rig.a, "globex", v2, who="rules-globex")
    assert changed.status_code == 200, changed.text
    elapsed = time.monotonic() - started + await _until(http, rig.b, "rule:second", 1.0)
    print(f"rule change visible in the second process after {elapsed * 1000:.0f} ms")

    reply = await http.post(f"{rig.b}/v1/rules/globex/rollback", params={"to": number},
                            headers=auth("rules-globex"))  # fmt: skip
    assert reply.status_code == 200, reply.text
    restored = reply.json()
    assert restored["source"] == v1 and restored["restored"] == number
    await _until(http, rig.a, "rule:first", 1.0)
    after = await explain(http, rig.a, chat("propagation probe"), who="globex")
    same = {"rules_version", "signals"}  # the plan, not the live queue state it was made on
    assert {k: v for k, v in after.items() if k not in same} == {
        k: v for k, v in before.items() if k not in same
    }
    history = (await http.get(f"{rig.a}/v1/rules/globex/versions", headers=auth("globex"))).json()
    versions = history["data"]
    assert [v["action"] for v in versions][-3:] == ["put", "put", "rollback"]
    assert all(v["author"] == "rules-globex" for v in versions[-3:])
    assert "+    then: {tier: external}" in versions[-2]["diff"]
    assert versions[-1]["created_at"]


async def test_invalid_rules_are_rejected_and_the_running_ones_stay(
    rig: Rig, http: httpx.AsyncClient
) -> None:
    good = "rules:\n  - id: keep-me\n    then: {tier: large}\n"
    assert (await put_rules(http, rig.a, "initech", good)).status_code == 200
    version = (await http.get(f"{rig.a}/v1/rules/initech", headers=auth("admin"))).json()
    bad = "rules:\n  - id: broken\n    when:\n      prompt_tokens: {gt: lots}\n    then: {}\n"
    for path in ("", "/validate"):
        method = http.put if not path else http.post
        reply = await method(f"{rig.a}/v1/rules/initech{path}", content=bad, headers=auth("admin"))
        assert reply.status_code == 400
        error = reply.json()["error"]
        assert error["code"] == "invalid_rules"
        assert error["message"].startswith("line 4: rules[0].when.prompt_tokens.gt")
    still = (await http.get(f"{rig.b}/v1/rules/initech", headers=auth("admin"))).json()
    assert still["version"] == version["version"] and still["source"] == good
    plan = await explain(http, rig.a, chat(), who="initech")
    assert plan["rule"] == "rule:keep-me"
    ok = await http.post(f"{rig.a}/v1/rules/initech/validate", content=good, headers=auth("admin"))
    assert ok.json() == {
        "object": "rules.validation",
        "valid": True,
        "rules": ["keep-me"],
        "active_version": version["version"],
        "diff": "",  # the same text as the running version
    }
    gone = await http.delete(f"{rig.a}/v1/rules/initech", headers=auth("admin"))
    assert gone.status_code == 200 and gone.json()["source"] is None


async def test_an_alias_bomb_is_refused_at_once_and_the_gateway_keeps_serving(
    rig: Rig, http: httpx.AsyncClient
) -> None:
    """Issue 20: a 299-byte body to validate/PUT stalled the event loop for minutes."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    bomb = "\n".join(lines) + "\n"
    for path in ("", "/validate"):
        method = http.put if not path else http.post
        started = time.monotonic()
        reply, health = await asyncio.gather(
            method(f"{rig.a}/v1/rules/initech{path}", content=bomb, headers=auth("admin")),
            http.get(f"{rig.a}/healthz"),
        )
        assert time.monotonic() - started < 5.0
        assert health.status_code == 200
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["code"] == "invalid_rules"
        assert "aliases are expanded" in reply.json()["error"]["message"]


# ---------- authorization ----------


@pytest.mark.parametrize(
    ("who", "method", "tenant", "status"),
    [
        ("acme", "GET", "acme", 200),
        ("acme", "GET", "globex", 403),
        ("acme", "PUT", "acme", 403),
        ("acme", "PUT", "globex", 403),
        ("acme", "DELETE", "acme", 403),
        ("acme", "ROLLBACK", "acme", 403),
        ("acme", "VALIDATE", "acme", 403),
        ("acme", "HISTORY", "globex", 403),
        ("rules-acme", "PUT", "acme", 200),
        ("rules-acme", "GET", "acme", 200),
        ("rules-acme", "GET", "globex", 403),
        ("rules-acme", "PUT", "globex", 403),
        ("rules-acme", "DELETE", "globex", 403),
        ("rules-acme", "HISTORY", "globex", 403),
        ("rules-acme", "PUT", "_global", 403),
        ("admin", "PUT", "globex", 200),
        ("admin", "GET", "acme", 200),
    ],
)
async def test_who_may_read_and_write_whose_rules(
    rig: Rig, http: httpx.AsyncClient, who: str, method: str, tenant: str, status: int
) -> None:
    base = f"{rig.a}/v1/rules/{tenant}"
    source = "rules:\n  - id: authz\n    then: {max_tokens: 100}\n"
    if method == "GET":
        reply = await http.get(base, headers=auth(who))
    elif method == "HISTORY":
        reply = await http.get(f"{base}/versions", headers=auth(who))
    elif method == "PUT":
        reply = await http.put(base, content=source, headers=auth(who))
    elif method == "VALIDATE":
        reply = await http.post(f"{base}/validate", content=source, headers=auth(who))
    elif method == "DELETE":
        reply = await http.delete(base, headers=auth(who))
    else:
        reply = await http.post(f"{base}/rollback", params={"to": 1}, headers=auth(who))
    assert reply.status_code == status, reply.text


async def test_listing_and_explain_are_scoped(rig: Rig, http: httpx.AsyncClient) -> None:
    await put_rules(http, rig.a, "globex", "rules: []\n")
    listed = (await http.get(f"{rig.a}/v1/rules", headers=auth("acme"))).json()
    assert {row["tenant"] for row in listed["data"]} <= {"acme", "_global"}
    other = await http.post(f"{rig.a}/v1/route/explain", params={"tenant": "globex"},
                            json=chat(), headers=auth("acme"))  # fmt: skip
    assert other.status_code == 403
    as_admin = await http.post(f"{rig.a}/v1/route/explain", params={"tenant": "globex"},
                               json=chat(), headers=auth("admin"))  # fmt: skip
    assert as_admin.status_code == 200 and as_admin.json()["tenant"] == "globex"


# ---------- the worked examples of docs/rules.md ----------


async def test_worked_examples(rig: Rig, http: httpx.AsyncClient) -> None:
    def example(name: str) -> str:
        return (EXAMPLES / name).read_text()

    assert (await put_rules(http, rig.a, "acme", example("pii-on-prem.yaml"))).status_code == 200
    plan = await explain(http, rig.a, chat(), headers={"x-tiergate-tags": "pii"})
    assert plan["rule"] == "rule:pii-on-prem" and EXTERNAL not in plan["deployments"]
    plan = await explain(http, rig.a, chat("my SSN is 123-45-6789, file it"))
    assert plan["rule"] == "rule:pii-words-on-prem" and plan["continuation"] is False

    await put_rules(http, rig.a, "acme", example("code-review.yaml"))
    plan = await explain(http, rig.a, chat("Can you review my diff?"))
    assert (plan["rule"], plan["tier"]) == ("rule:code-review-large", "large")
    assert plan["deployments"] == [LARGE, EXTERNAL]

    await put_rules(http, rig.a, "_global", example("free-plan.yaml"))
    plan = await explain(http, rig.a, chat("Can you review my diff?"), who="initech")
    assert (plan["rule"], plan["deployments"]) == ("rule:free-plan-small", [SMALL])
    assert plan["max_tokens"] == 256 and plan["priority"] == "batch"

    await put_rules(http, rig.a, "acme", example("spill-external.yaml"))
    plan = await explain(http, rig.a, chat())
    assert "large-circuit-open" in [s["rule"] for s in plan["skipped_rules"]]

    await put_rules(http, rig.a, "acme", example("per-app-quality.yaml"))
    plan = await explain(http, rig.a, chat(), headers={"x-tiergate-app": "support-bot"})
    assert plan["rule"] == "rule:support-frugal" and plan["tier"] == "small"
    plan = await explain(http, rig.a, chat(), headers={"x-tiergate-app": "research"})
    assert plan["rule"] == "rule:research-generous"
    await http.delete(f"{rig.a}/v1/rules/_global", headers=auth("admin"))
