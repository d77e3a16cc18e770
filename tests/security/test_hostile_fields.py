"""Hostile values in every field and header of every route, on both ports, against PostgreSQL.

Each case sends NUL, another control character or an outsized value where a route reads a
string (body, query, path, header) and must get a 4xx with an OpenAI error body — never a 5xx.
Afterwards every authenticated chat request must have its ledger row in PostgreSQL (which cannot
store NUL in text): one bad value must not stop the ledger sink for everyone.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.engine import make_url

from gateway.accounting.schema import ledger_entries
from gateway.app import create_admin_app, create_app
from gateway.services import Services, open_services
from gateway.settings import Settings
from tests.conftest import DATABASE_URL
from tests.gateway.accounting.conftest import _admin
from tests.gateway.auth.conftest import auth_settings

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

ACME = {"authorization": "Bearer dev-acme"}
ADMIN = {"authorization": "Bearer dev-admin"}
FINANCE = {"authorization": "Bearer dev-finance"}
NUL = "\u0000"


@dataclass(frozen=True)
class Case:
    what: str
    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    json: Any = None
    content: bytes | None = None
    params: dict[str, str] | None = None
    param: str | None = None
    """The ``param`` the error body must name (``None``: not checked)."""


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": "auto", "messages": [{"role": "user", "content": "hi"}], **fields}


def _chat_cases(path: str) -> list[Case]:
    def post(what: str, body: Any, param: str | None, **headers: str) -> Case:
        return Case(f"{path} {what}", "POST", path, {**ACME, **headers}, json=body, param=param)

    meta_keys = {
        "app": "x-tiergate-app",
        "tags": "x-tiergate-tags",
        "priority": "x-tiergate-priority",
        "conversation_id": "x-tiergate-conversation-id",
        "idempotency_key": "idempotency-key",
        "timeout_ms": "x-tiergate-timeout-ms",
    }
    cases = [
        post("model NUL", _chat(model=f"sm{NUL}all"), "model"),
        post("model control", _chat(model="small\x1b[2J"), "model"),
        post("model huge", _chat(model="m" * 100_000), "model"),
        post("user NUL", _chat(user=f"u{NUL}"), "user"),
        post("user control", _chat(user="u\x07"), "user"),
        post("user huge", _chat(user="u" * 10_000), "user"),
        post(
            "content NUL",
            _chat(messages=[{"role": "user", "content": f"a{NUL}b"}]),
            "messages.0.content",
        ),
        post(
            "part NUL",
            _chat(messages=[{"role": "user", "content": [{"type": "text", "text": NUL}]}]),
            "messages.0.content.0.text",
        ),
        post(
            "name NUL",
            _chat(messages=[{"role": "user", "content": "x", "name": NUL}]),
            "messages.0.name",
        ),
        post("stop NUL", _chat(stop=[NUL]), "stop.0"),
        post("unknown field NUL", _chat(top_k_hint=NUL), "top_k_hint"),
        post("metadata key NUL", _chat(metadata={f"app{NUL}": "x"}), "metadata.app?"),
        post("app huge", _chat(metadata={"app": "a" * 1_500_000}), "metadata.app"),
        post(
            "tags many",
            _chat(metadata={"tags": ",".join(f"t{i}" for i in range(100_000))}),
            "metadata.tags",
        ),
        post("tag huge", _chat(metadata={"tags": "t" * 5_000}), "metadata.tags"),
        post(
            "conversation huge",
            _chat(metadata={"conversation_id": "c" * 5_000}),
            "metadata.conversation_id",
        ),
        post(
            "idempotency huge",
            _chat(metadata={"idempotency_key": "k" * 5_000}),
            "metadata.idempotency_key",
        ),
        post("timeout huge", _chat(metadata={"timeout_ms": "9" * 5_000}), "metadata.timeout_ms"),
    ]
    for key, header in meta_keys.items():
        for label, bad in (("NUL", f"a{NUL}b"), ("control", "a\x01b"), ("DEL", "a\x7fb")):
            in_body = _chat(metadata={key: bad})
            cases.append(post(f"metadata.{key} {label}", in_body, f"metadata.{key}"))
            cases.append(post(f"{header} {label}", _chat(), header, **{header: bad}))
    cases.append(
        post("x-tiergate-app huge", _chat(), "x-tiergate-app", **{"x-tiergate-app": "a" * 10_000})
    )
    cases.append(
        post(
            "x-tiergate-tags many",
            _chat(),
            "x-tiergate-tags",
            **{"x-tiergate-tags": ",".join(f"t{i}" for i in range(2_000))},
        )
    )
    return cases


PUBLIC_CASES: list[Case] = [
    *_chat_cases("/v1/chat/completions"),
    *_chat_cases("/v1/route/explain"),
    Case("costs tenant NUL", "GET", "/v1/reports/costs", FINANCE, params={"tenant": NUL}),
    Case("costs app NUL", "GET", "/v1/reports/costs", FINANCE, params={"app": NUL}),
    Case("costs tenant huge", "GET", "/v1/reports/costs", FINANCE, params={"tenant": "t" * 9999}),
    Case("costs group NUL", "GET", "/v1/reports/costs", FINANCE, params={"group_by": NUL}),
    Case("costs from NUL", "GET", "/v1/reports/costs", FINANCE, params={"from": NUL}),
    Case("costs from huge", "GET", "/v1/reports/costs", FINANCE, params={"from": "99999-01-01"}),
    Case("what-if tenant NUL", "GET", "/v1/reports/what-if", FINANCE, params={"tenant": NUL}),
    Case("budgets tenant NUL", "GET", "/v1/reports/budgets", FINANCE, params={"tenant": NUL}),
    Case("costs tenant NUL (acme)", "GET", "/v1/reports/costs", ACME, params={"tenant": NUL}),
    Case("rules tenant NUL", "GET", "/v1/rules/%00", ADMIN),
    Case("rules version huge", "GET", "/v1/rules/acme/versions/99999999999999999999", ADMIN),
    Case(
        "rules version negative huge", "GET", "/v1/rules/acme/versions/-99999999999999999999", ADMIN
    ),
    Case(
        "rules rollback huge",
        "POST",
        "/v1/rules/acme/rollback",
        ADMIN,
        params={"to": "99999999999999999999"},
    ),
    Case("rules history tenant NUL", "GET", "/v1/rules/%00/versions", ADMIN),
    Case(
        "rules put id NUL",
        "PUT",
        "/v1/rules/acme",
        ADMIN,
        content=b'rules:\n  - id: "a\\0b"\n    then: {tier: small}\n',
    ),
    Case(
        "rules put id newline",
        "PUT",
        "/v1/rules/acme",
        ADMIN,
        content=b'rules:\n  - id: "ab\\n"\n    then: {tier: small}\n',
    ),
    Case(
        "rules put app NUL",
        "PUT",
        "/v1/rules/acme",
        ADMIN,
        content=b'rules:\n  - id: a\n    when: {app: "x\\0"}\n    then: {tier: small}\n',
    ),
    Case(
        "rules put description NUL",
        "PUT",
        "/v1/rules/acme",
        ADMIN,
        content=b'rules:\n  - id: a\n    description: "x\\0"\n    then: {tier: small}\n',
    ),
    Case(
        "rules put JSON NUL",
        "PUT",
        "/v1/rules/acme",
        ADMIN,
        content=b'{"rules": [{"id": "a", "description": "\\u0000", "then": {"tier": "small"}}]}',
    ),
    Case(
        "rules validate NUL",
        "POST",
        "/v1/rules/acme/validate",
        ADMIN,
        content=b'rules:\n  - id: "a\\0"\n    then: {tier: small}\n',
    ),
    Case("console figures tenant NUL", "GET", "/v1/rules/a%00/figures", ADMIN),
    Case(
        "console what-if days huge",
        "POST",
        "/v1/rules/acme/what-if",
        ADMIN,
        content=b"rules: []",
        params={"days": "99999999999999999999"},
    ),
    Case(
        "console explain tenant NUL",
        "POST",
        "/v1/rules/a%00/explain",
        ADMIN,
        json={"request": _chat()},
    ),
    Case("rules raw NUL byte", "PUT", "/v1/rules/acme", ADMIN, content=b"rules: []\x00"),
]

ADMIN_CASES: list[Case] = [
    Case(
        "tenant name NUL",
        "POST",
        "/v1/admin/tenants",
        ADMIN,
        json={"name": f"a{NUL}"},
        param="name",
    ),
    Case(
        "tenant name huge",
        "POST",
        "/v1/admin/tenants",
        ADMIN,
        json={"name": "a" * 100_000},
        param="name",
    ),
    Case("get tenant NUL", "GET", "/v1/admin/tenants/a%00", ADMIN),
    Case("patch tenant NUL", "PATCH", "/v1/admin/tenants/a%00", ADMIN, json={"weight": 2}),
    Case("delete tenant NUL", "DELETE", "/v1/admin/tenants/a%00", ADMIN),
    Case(
        "key principal NUL",
        "POST",
        "/v1/admin/keys",
        ADMIN,
        json={"principal": f"p{NUL}", "roles": ["finance"]},
        param="principal",
    ),
    Case(  # Python's json (FastAPI's) decodes "\ud800" to a lone surrogate; UTF-8 has none
        "key principal surrogate",
        "POST",
        "/v1/admin/keys",
        ADMIN,
        json={"principal": "p\ud800", "roles": ["finance"]},
        param="principal",
    ),
    Case(
        "tenant budget tag NUL",
        "POST",
        "/v1/admin/tenants",
        ADMIN,
        json={"name": "t1", "budgets": [{"name": "b", "limit_usd": 1, "tag": NUL}]},
        param="budgets.0.tag",
    ),
    Case(
        "key principal control",
        "POST",
        "/v1/admin/keys",
        ADMIN,
        json={"principal": "p\n", "roles": ["finance"]},
        param="principal",
    ),
    Case(
        "key role NUL",
        "POST",
        "/v1/admin/keys",
        ADMIN,
        json={"principal": "p", "roles": [f"tenant:acme{NUL}"]},
        param="roles.0",
    ),
    Case(
        "key note NUL",
        "POST",
        "/v1/admin/keys",
        ADMIN,
        json={"principal": "p", "roles": ["finance"], "note": NUL},
        param="note",
    ),
    Case(
        "key expiry huge",
        "POST",
        "/v1/admin/keys",
        ADMIN,
        json={"principal": "p", "roles": ["finance"], "expires_in_s": 10**18},
        param="expires_in_s",
    ),
    Case(
        "key expiry over int64",
        "POST",
        "/v1/admin/keys",
        ADMIN,
        json={"principal": "p", "roles": ["finance"], "expires_in_s": 10**30},
        param="expires_in_s",
    ),
    Case(
        "key two tenants",
        "POST",
        "/v1/admin/keys",
        ADMIN,
        json={"principal": "p", "roles": ["tenant:acme", "rules:globex"]},
        param="roles",
    ),
    Case("list keys principal NUL", "GET", "/v1/admin/keys", ADMIN, params={"principal": NUL}),
    Case("get key NUL", "GET", "/v1/admin/keys/k%00", ADMIN),
    Case("rotate key NUL", "POST", "/v1/admin/keys/k%00/rotate", ADMIN, json={}),
    Case("revoke key NUL", "POST", "/v1/admin/keys/k%00/revoke", ADMIN),
]


@pytest.fixture
def pg_database() -> Iterator[str]:
    name = f"tg_test_{secrets.token_hex(6)}"
    asyncio.run(_admin(DATABASE_URL, f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(DATABASE_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        asyncio.run(_admin(DATABASE_URL, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def pg_settings(tmp_path: Path, redis_url: str, key_prefix: str, pg_database: str) -> Settings:
    base = auth_settings(tmp_path, redis_url, key_prefix)
    return base.model_copy(
        update={
            "database": base.database.model_copy(update={"url": pg_database}),
            # no workers here: a request that got past validation answers 504 soon (a problem)
            "queue": base.queue.model_copy(update={"default_timeout_ms": 300}),
        }
    )


@pytest.fixture
async def pg_services(pg_settings: Settings) -> AsyncIterator[Services]:
    async with open_services(pg_settings, dev=True, workers=False, sink=True) as built:
        await asyncio.sleep(0.1)
        yield built


async def _send(client: httpx.AsyncClient, case: Case) -> httpx.Response:
    headers = dict(case.headers)
    content = case.content
    if case.json is not None:  # json.dumps: orjson refuses integers over 64 bits
        content = json.dumps(case.json).encode()
        headers["content-type"] = "application/json"
    return await client.request(
        case.method, case.path, headers=headers, content=content, params=case.params
    )


def _problem(case: Case, response: httpx.Response) -> str | None:
    status = response.status_code
    if not 400 <= status < 500:
        return f"{case.what}: {status} {response.text[:200]}"
    error = response.json().get("error")
    if not isinstance(error, dict) or set(error) != {"message", "type", "param", "code"}:
        return f"{case.what}: not an OpenAI error body: {response.text[:200]}"
    if case.param is not None and error["param"] != case.param:
        got = f"{status} param {error['param']!r}: {error['message'][:100]}"
        return f"{case.what}: {got}; expected param {case.param!r}"
    return None


async def _run(client: httpx.AsyncClient, cases: list[Case]) -> tuple[list[str], list[str]]:
    problems: list[str] = []
    request_ids: list[str] = []
    for case in cases:
        response = await _send(client, case)
        if (problem := _problem(case, response)) is not None:
            problems.append(problem)
        if case.path == "/v1/chat/completions":
            request_ids.append(response.headers.get("x-request-id", f"<none: {case.what}>"))
    return problems, request_ids


async def test_public_port(pg_services: Services) -> None:
    app = create_app(services=pg_services)
    app.state.services = pg_services
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://public") as client:
        problems, request_ids = await _run(client, PUBLIC_CASES)
        # an ordinary request afterwards is still booked (the sink was not stopped)
        ok = await client.post("/v1/chat/completions", json=_chat(model="nope"), headers=ACME)
        assert ok.status_code == 404
        request_ids.append(ok.headers["x-request-id"])
    problems += await _unbooked(pg_services, request_ids)
    assert not problems, "\n".join(problems)


async def test_admin_port(pg_services: Services) -> None:
    app = create_admin_app(pg_services)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
        problems, _ = await _run(client, ADMIN_CASES)
    assert not problems, "\n".join(problems)


async def _unbooked(services: Services, request_ids: list[str]) -> list[str]:
    """Request ids without their row in PostgreSQL after a few seconds."""
    wanted = set(request_ids)
    missing = wanted
    for _ in range(50):
        async with services.ledger.engine.connect() as conn:
            rows = await conn.execute(
                select(ledger_entries.c.request_id).where(ledger_entries.c.request_id.in_(wanted))
            )
            missing = wanted - {r[0] for r in rows}
        if not missing:
            return []
        await asyncio.sleep(0.1)
    return [f"{len(missing)} of {len(wanted)} chat requests have no ledger row"]


async def test_refusals_before_authentication_carry_a_request_id(
    public_client: httpx.AsyncClient, admin_client: httpx.AsyncClient
) -> None:
    """Issue 20: a 401 had no ``x-request-id`` (only chat requests past authentication did)."""
    answers = [
        await public_client.post("/v1/chat/completions", json=_chat()),
        await public_client.post(
            "/v1/chat/completions", json=_chat(), headers={"authorization": "Bearer nope"}
        ),
        await public_client.get("/v1/reports/costs", headers={"authorization": "Bearer nope"}),
        await admin_client.get("/v1/admin/keys"),
        await admin_client.get("/v1/admin/keys", headers=ACME),  # 403
    ]
    assert [a.status_code for a in answers] == [401, 401, 401, 401, 403]
    ids = [a.headers.get("x-request-id") or "" for a in answers]
    assert all(i.startswith("req_") and len(i) == 36 for i in ids), ids
    assert len(set(ids)) == len(ids)


async def test_a_tiny_sdk_read_timeout_is_not_an_instant_504(
    public_client: httpx.AsyncClient,
) -> None:
    """Issue 20: ``x-stainless-read-timeout: 1e-300`` made a 1 ms deadline (an immediate 504);
    it counts as 1 s, a deadline of 0.9 s (what ``/v1/route/explain`` reports)."""
    answer = await public_client.post(
        "/v1/route/explain", json=_chat(), headers={**ACME, "x-stainless-read-timeout": "1e-300"}
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["timeout_ms"] == 900
