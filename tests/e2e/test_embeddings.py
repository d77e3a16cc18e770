"""``POST /v1/embeddings`` through the official openai client, against real processes: a chat
simulator and an embedding one (``bge-m3``) behind ``tiergate serve``. Vectors in OpenAI's
shape (float and base64, the SDK's default), one ledger row per request priced per input
token, the batching limits' 400s, and the cost report grouped by endpoint."""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Iterator
from decimal import Decimal

import httpx
import openai
import pytest

from tests.support import Stack
from tests.support.ledger import wait_entry

EMBEDDING = "bge-m3"
PRICE_PER_TOKEN = Decimal("0.01") / 1_000_000  # deploy/config.example.yaml


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Stack]:
    profiles = ("llama-3.1-8b-instruct", EMBEDDING)
    with Stack.run(tmp_path_factory.mktemp("embed"), redis_url, profiles) as running:
        yield running


def client(stack: Stack, tenant: str = "acme") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{stack.base_url}/v1", api_key=stack.key(tenant), max_retries=0, timeout=30
    )


async def test_vectors_usage_and_ledger_row(stack: Stack) -> None:
    texts = ["The food was delicious.", "The service was slow.", "The food was delicious."]
    async with client(stack) as api:
        raw = await api.embeddings.with_raw_response.create(
            model=EMBEDDING, input=texts, encoding_format="float"
        )
    answer = raw.parse()
    assert answer.model == EMBEDDING and len(answer.data) == 3
    assert [d.index for d in answer.data] == [0, 1, 2]
    vectors = [d.embedding for d in answer.data]
    assert all(len(v) == 1024 for v in vectors)
    assert all(abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-6 for v in vectors)
    assert vectors[0] == vectors[2] and vectors[0] != vectors[1]  # deterministic per input
    assert answer.usage.prompt_tokens > 0
    assert answer.usage.total_tokens == answer.usage.prompt_tokens
    entry = await wait_entry(stack.database_url, raw.headers["x-request-id"])
    assert (entry.endpoint, entry.outcome, entry.deployment) == ("embeddings", "ok", EMBEDDING)
    assert entry.prompt_tokens == answer.usage.prompt_tokens
    assert entry.completion_tokens == 0
    assert entry.cost_nano_usd == int(PRICE_PER_TOKEN * entry.prompt_tokens * 10**9)
    assert entry.cost_usd == Decimal(raw.headers["x-tiergate-cost-usd"])
    assert "E" not in raw.headers["x-tiergate-cost-usd"]  # 0.000000050, never 5.0E-8
    assert entry.baseline_micro_usd == entry.cost_micro_usd  # no chat model to save against


async def test_base64_is_the_same_vector(stack: Stack) -> None:
    async with client(stack, "globex") as api:
        floats = await api.embeddings.create(
            model="auto", input="tiergate", encoding_format="float"
        )
        # Without encoding_format the SDK asks for base64 and decodes it.
        decoded = await api.embeddings.create(model="auto", input="tiergate")
        raw = await api.embeddings.with_raw_response.create(
            model=EMBEDDING, input="tiergate", encoding_format="base64", dimensions=256
        )
    assert floats.model == EMBEDDING
    assert len(decoded.data[0].embedding) == 1024
    pairs = zip(floats.data[0].embedding, decoded.data[0].embedding, strict=True)
    assert max(abs(a - b) for a, b in pairs) < 1e-6  # float32 on the wire
    short = raw.parse().data[0].embedding  # asked for base64 itself: the SDK leaves it
    assert isinstance(short, str)
    floats32 = struct.unpack(f"<{256}f", base64.b64decode(short))  # dimensions passed through
    assert abs(math.sqrt(sum(x * x for x in floats32)) - 1) < 1e-5


async def test_token_ids(stack: Stack) -> None:
    async with client(stack) as api:
        answer = await api.embeddings.create(
            model=EMBEDDING, input=[[1, 2, 3], [4, 5]], encoding_format="float"
        )
    assert len(answer.data) == 2 and answer.usage.prompt_tokens == 5


@pytest.mark.parametrize(
    ("payload", "code", "param"),
    [
        ({"input": ["x"] * 2049}, "invalid_request", "input"),
        ({"input": ["fine", "word " * 40_000]}, "context_length_exceeded", "input.1"),
        ({"input": []}, "invalid_request", "input"),
        ({"input": ["ok", ""]}, "invalid_request", "input.1"),
        ({"input": ["ok", [1, 2]]}, "invalid_request", "input"),
        ({"input": "hi", "encoding_format": "int8"}, "invalid_request", "encoding_format"),
    ],
)
def test_batching_limits_answer_400(
    stack: Stack, payload: dict[str, object], code: str, param: str
) -> None:
    headers = {"authorization": f"Bearer {stack.key('acme')}"}
    response = httpx.post(
        f"{stack.base_url}/v1/embeddings",
        json={"model": EMBEDDING, **payload},
        headers=headers,
        timeout=30,
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, param)


async def test_refusals_are_booked_as_embeddings(stack: Stack) -> None:
    async with client(stack) as api:
        with pytest.raises(openai.BadRequestError) as too_long:
            await api.embeddings.create(model=EMBEDDING, input=["word " * 9000])
        with pytest.raises(openai.NotFoundError) as chat_model:
            await api.embeddings.create(model="llama-3.1-8b-instruct", input="hi")
        with pytest.raises(openai.NotFoundError) as embedding_on_chat:
            await api.chat.completions.create(
                model=EMBEDDING, messages=[{"role": "user", "content": "hi"}]
            )
    assert too_long.value.code == "context_length_exceeded"
    row = await wait_entry(stack.database_url, too_long.value.response.headers["x-request-id"])
    assert (row.endpoint, row.status_code, row.cost_micro_usd) == ("embeddings", 400, 0)
    assert chat_model.value.code == "model_not_found"
    assert embedding_on_chat.value.code == "model_not_found"
    row = await wait_entry(
        stack.database_url, embedding_on_chat.value.response.headers["x-request-id"]
    )
    assert row.endpoint == "chat"


async def test_models_and_report_by_endpoint(stack: Stack) -> None:
    async with client(stack, "initech") as api:
        models = {m.id for m in (await api.models.list()).data}
        answer = await api.embeddings.with_raw_response.create(model=EMBEDDING, input="report me")
        chat = await api.chat.completions.with_raw_response.create(
            model="small", messages=[{"role": "user", "content": "Say hello."}], max_tokens=8
        )
    assert EMBEDDING in models
    for raw in (answer, chat):
        await wait_entry(stack.database_url, raw.headers["x-request-id"])
    async with httpx.AsyncClient(timeout=30) as http:
        report = await http.get(
            f"{stack.base_url}/v1/reports/costs",
            params={"group_by": "endpoint"},
            headers={"authorization": f"Bearer {stack.key('initech')}"},
        )
    assert report.status_code == 200, report.text
    rows = {row["endpoint"]: row for row in report.json()["rows"]}
    assert {"chat", "embeddings"} <= set(rows)
    assert rows["embeddings"]["completion_tokens"] == 0
    assert rows["embeddings"]["requests"] >= 1
