"""Nothing leaks: after real traffic (JSON, stream, refusals, a run-time key, the admin API)
the captured logs (every logger, DEBUG, the JSON formatter), the metrics, the ledger database
and the ledger's Redis stream hold no key material and no prompt or completion text — except
the prompts of a tenant that opted in while the operator allowed it."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import redis
import yaml
from aiohttp import web
from prometheus_client import generate_latest

from backends.sim import PROFILES, create_sim_app
from gateway.app import create_admin_app, create_app
from gateway.observability.logging import JsonFormatter
from gateway.services import Services, open_services
from gateway.settings import load_settings
from tests.support import free_port, gateway_config, value_when

MODEL = "llama-3.1-8b-instruct"


@pytest.fixture
async def sim() -> AsyncIterator[int]:
    """The simulator in this process (a real HTTP server on a free port): quick to start."""
    runner = web.AppRunner(create_sim_app(PROFILES[MODEL], time_scale=0.0))
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    yield port
    await runner.cleanup()


@pytest.fixture
def captured() -> Iterator[list[str]]:
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Keep(level=logging.DEBUG)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield lines
    root.removeHandler(handler)
    root.setLevel(old_level)


@pytest.fixture
async def services(
    tmp_path: Path, sim: int, redis_url: str, key_prefix: str
) -> AsyncIterator[Services]:
    path = gateway_config(
        workdir=tmp_path,
        redis_url=redis_url,
        prefix=key_prefix,
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'tiergate.db'}",
        sim_ports={MODEL: sim},
        port=free_port(),
        admin_port=free_port(),
    )
    config = yaml.safe_load(path.read_text())
    config["logging"] = {"log_prompts": True, "level": "debug"}  # the operator allows it...
    config["tenants"]["globex"]["log_prompts"] = True  # ...and only globex opted in
    for tenant in config["tenants"].values():
        tenant["allowed_tiers"] = ["small"]
    path.write_text(yaml.safe_dump(config))
    async with open_services(load_settings(path), dev=True, workers=True) as built:
        yield built


async def test_no_key_or_text_leaks(
    services: Services, captured: list[str], tmp_path: Path, redis_url: str, key_prefix: str
) -> None:
    public = create_app(services=services)
    public.state.services = services
    pub = httpx.AsyncClient(transport=httpx.ASGITransport(app=public), base_url="http://p")
    adm = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_admin_app(services)), base_url="http://a"
    )
    secret_prompt = f"acme-private-{uuid.uuid4().hex}"
    opted_in = f"globex-logged-{uuid.uuid4().hex}"
    wrong_key = f"sk-wrong-{uuid.uuid4().hex}"
    leaks: list[str] = [secret_prompt, wrong_key, "dev-acme", "dev-admin", "dev-globex"]
    try:
        made = await adm.post(
            "/v1/admin/keys",
            json={"principal": "acme-app", "roles": ["tenant:acme"]},
            headers={"authorization": "Bearer dev-admin"},
        )
        assert made.status_code == 201
        runtime_key = made.json()["key"]
        leaks += [runtime_key, runtime_key.split("_", 2)[2]]

        def chat(prompt: str, **extra: object) -> dict[str, object]:
            return {"model": "auto", "messages": [{"role": "user", "content": prompt}], **extra}

        acme = {"authorization": "Bearer dev-acme"}
        answer = await pub.post("/v1/chat/completions", json=chat(secret_prompt), headers=acme)
        assert answer.status_code == 200, answer.text
        completion = answer.json()["choices"][0]["message"]["content"]
        leaks.append(completion)
        streamed = await pub.post(
            "/v1/chat/completions", json=chat(secret_prompt, stream=True), headers=acme
        )
        assert streamed.status_code == 200 and "data:" in streamed.text
        by_runtime = await pub.post(
            "/v1/chat/completions",
            json=chat(secret_prompt),
            headers={"authorization": f"Bearer {runtime_key}"},
        )
        assert by_runtime.status_code == 200
        refused = await pub.post(
            "/v1/chat/completions",
            json=chat(secret_prompt),
            headers={"authorization": f"Bearer {wrong_key}"},
        )
        assert refused.status_code == 401 and wrong_key not in refused.text
        bad = await pub.post(
            "/v1/chat/completions", json=chat(secret_prompt, max_tokens=-1), headers=acme
        )
        assert bad.status_code == 400 and secret_prompt not in bad.text
        logged = await pub.post(
            "/v1/chat/completions",
            json=chat(opted_in),
            headers={"authorization": "Bearer dev-globex"},
        )
        assert logged.status_code == 200
        await services.auth.flush()
    finally:
        await pub.aclose()
        await adm.aclose()
    await _wait_for_ledger(services, 5)

    logs = "\n".join(captured)
    metrics = generate_latest(services.metrics.registry).decode()
    database = b"".join(p.read_bytes() for p in tmp_path.glob("tiergate.db*"))  # noqa: ASYNC240
    client = redis.Redis.from_url(redis_url)
    try:
        stream = b"".join(
            b"".join(k + v for k, v in fields.items())
            for _id, fields in client.xrange(services.redis_keys.ledger_events)
        )
    finally:
        client.close()
    assert len(captured) > 5, "nothing was logged: the capture is broken"
    assert opted_in in logs  # the opt-in works, so the capture would see a prompt
    for leak in leaks:
        assert leak not in logs, f"in the logs: {leak[:20]}…"
        assert leak not in metrics, f"in the metrics: {leak[:20]}…"
        assert leak.encode() not in database, f"in the database: {leak[:20]}…"
        assert leak.encode() not in stream, f"in the ledger stream: {leak[:20]}…"
    assert opted_in.encode() not in database  # logging opt-in never means storing


async def _wait_for_ledger(services: Services, rows: int) -> None:
    from sqlalchemy import func, select

    from gateway.accounting.schema import ledger_entries

    async def count() -> int:
        async with services.ledger._engine.connect() as conn:
            booked = (await conn.execute(select(func.count()).select_from(ledger_entries))).scalar()
        return booked or 0

    await value_when(
        count, lambda booked: booked >= rows, 10, what="too few ledger rows", every_s=0.1
    )
