"""``POST /v1/embeddings`` of an embedding profile, as vLLM (``--task embed``) answers it.

``input`` is a string, a list of strings, a list of token ids or a list of such lists. Each
input's vector is deterministic: unit length, ``dimensions`` floats drawn from a generator
seeded with the input (its text, or its token ids), so the same input always gets the same
vector and different inputs different ones. ``dimensions`` (asked) shortens the vector and
renormalizes it, as a Matryoshka model does; more than the profile has is a 400.
``encoding_format`` ``base64`` sends each vector as little-endian float32 bytes in base64, as
OpenAI does (the SDK decodes it). An input over ``max_model_len`` tokens is a 400. Latency: the
prefill of every input's tokens (``SimState.ttft_s``). The usage log gets a line per request
(``completion_tokens`` 0). A chat profile answers 400 here, and an embedding profile on chat.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import math
import random
import struct
import time
import uuid
from collections.abc import Sequence
from typing import Any

import orjson
from aiohttp import web

from backends.sim.errors import SimError, error_response, model_not_found
from backends.sim.state import SIM_STATE, SimState
from backends.sim.tokens import count_tokens
from backends.sim.usage_log import UsageRecord

__all__ = ["embed_vector", "embeddings"]


def embed_vector(seed: bytes, dimensions: int) -> list[float]:
    """The unit vector of an input (``seed``: its text's or token ids' bytes)."""
    rng = random.Random(hashlib.sha256(seed).digest())
    raw = [rng.gauss(0.0, 1.0) for _ in range(dimensions)]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [x / norm for x in raw]


def _inputs(value: Any) -> list[tuple[bytes, int]]:
    """Each input's seed and token count."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise SimError(400, "input must be a string or a non-empty list", param="input")
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        value = [value]
    out: list[tuple[bytes, int]] = []
    for item in value:
        if isinstance(item, str):
            out.append((item.encode(), count_tokens(item)))
        elif isinstance(item, list) and item and all(isinstance(v, int) for v in item):
            out.append((orjson.dumps(item), len(item)))
        else:
            raise SimError(400, "each input must be a string or a list of token ids", param="input")
    return out


def _shorten(vector: Sequence[float], dimensions: int) -> list[float]:
    cut = vector[:dimensions]
    norm = math.sqrt(sum(x * x for x in cut)) or 1.0
    return [x / norm for x in cut]


def _encoded(vector: list[float], encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector


def _answer(state: SimState, body: Any) -> tuple[dict[str, Any], int]:
    p = state.profile
    if not isinstance(body, dict):
        raise SimError(400, "The request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != p.name:
        raise model_not_found(p.flavor, str(model))
    if p.kind != "embedding":
        raise SimError(400, "The model does not support Embeddings API")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise SimError(
            400, f"encoding_format {encoding!r} is not supported", param="encoding_format"
        )
    dimensions = body.get("dimensions")
    if dimensions is not None and (
        not isinstance(dimensions, int) or not 1 <= dimensions <= p.dimensions
    ):
        raise SimError(400, f"dimensions must be between 1 and {p.dimensions}", param="dimensions")
    inputs = _inputs(body.get("input"))
    for i, (_, tokens) in enumerate(inputs):
        if tokens > p.max_model_len:
            raise SimError(
                400,
                f"This model's maximum context length is {p.max_model_len} tokens. However, "
                f"input {i} has {tokens} tokens. Please reduce the length of the input.",
                param="input",
            )
    data = []
    for i, (seed, _) in enumerate(inputs):
        vector = embed_vector(seed, p.dimensions)
        if dimensions is not None and dimensions < p.dimensions:
            vector = _shorten(vector, dimensions)
        data.append({"object": "embedding", "index": i, "embedding": _encoded(vector, encoding)})
    tokens = sum(t for _, t in inputs)
    answer = {
        "id": f"embd-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": p.name,
        "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
    }
    return answer, tokens


async def embeddings(request: web.Request) -> web.Response:
    state = request.app[SIM_STATE]
    request_id = request.headers.get("x-request-id") or f"sim-{uuid.uuid4().hex}"
    try:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            raise SimError(400, f"The request body is not valid JSON: {exc}") from None
        answer, tokens = _answer(state, body)
    except SimError as err:
        state.usage.write(UsageRecord(request_id, state.profile.name, False, err.status))
        return error_response(state.profile.flavor, err)
    delay = state.ttft_s(tokens)
    if delay > 0:
        await asyncio.sleep(delay)
    state.usage.write(UsageRecord(request_id, state.profile.name, False, 200, prompt_tokens=tokens))
    return web.Response(body=orjson.dumps(answer), content_type="application/json")
