"""Image parts: a text-only profile refuses them as a text-only vLLM model does, a vision profile
reads them (their tokens in the prompt), and ``VLLMBackend`` passes them through unchanged."""

from __future__ import annotations

import copy
import json
from typing import Any

import openai
import pytest

from backends.errors import BackendRejected
from backends.openai_http import VLLMBackend
from backends.sim.request import IMAGE_TOKENS, IMAGE_TOKENS_LOW
from backends.types import ChatRequest
from tests.backends.conftest import EXTERNAL, SMALL, StartSim, profile

PIXEL = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAE"
    "hQGAhKmMIQAAAABJRU5ErkJggg=="
)
TEXT = [{"role": "user", "content": [{"type": "text", "text": "What is in this picture?"}]}]


def with_image(detail: str | None = None) -> list[dict[str, Any]]:
    image: dict[str, Any] = {"url": PIXEL}
    if detail is not None:
        image["detail"] = detail
    messages = copy.deepcopy(TEXT)
    messages[0]["content"].append({"type": "image_url", "image_url": image})
    return messages


async def test_a_text_only_profile_refuses_an_image(start_sim: StartSim) -> None:
    sim = await start_sim(profile(SMALL), usage_log=None)
    async with sim.client() as client:
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(model=SMALL, messages=with_image())
        text = await client.chat.completions.create(model=SMALL, messages=TEXT)
    assert refused.value.status_code == 400 and "image input is not supported" in str(refused.value)
    assert text.choices[0].message.content


@pytest.mark.parametrize(("detail", "tokens"), [(None, IMAGE_TOKENS), ("low", IMAGE_TOKENS_LOW)])
async def test_a_vision_profile_counts_the_image(
    start_sim: StartSim, detail: str | None, tokens: int
) -> None:
    sim = await start_sim(profile(EXTERNAL))
    async with sim.client() as client:
        seen = await client.chat.completions.create(model=EXTERNAL, messages=with_image(detail))
        plain = await client.chat.completions.create(model=EXTERNAL, messages=TEXT)
    assert seen.usage.prompt_tokens == plain.usage.prompt_tokens + tokens
    assert seen.choices[0].message.content == plain.choices[0].message.content  # text decides


async def test_vllm_backend_passes_images_and_tools_through(start_sim: StartSim) -> None:
    """The body reaches the server as sent: the vision profile counts the image, calls the tool
    and streams its arguments; the text-only one refuses the same body (no retry)."""
    vision = await start_sim(profile(SMALL, vision=True))
    text_only = await start_sim(profile(SMALL))
    parameters = {"type": "object", "properties": {"what": {"type": "string"}}}
    tool = {"type": "function", "function": {"name": "describe", "parameters": parameters}}
    body = {"messages": with_image(), "tools": [tool], "tool_choice": "required"}
    sent = copy.deepcopy(body)
    backend = VLLMBackend("vision#0", vision.base_url, vision.http)
    reply = await backend.chat(ChatRequest(SMALL, body, "req-image-1"))
    assert body == sent  # nothing rewritten on the way
    plain = await backend.chat(ChatRequest(SMALL, {"messages": TEXT, "tools": [tool]}, "req-2"))
    assert reply.usage is not None and plain.usage is not None
    assert reply.usage.prompt_tokens == plain.usage.prompt_tokens + IMAGE_TOKENS
    (call,) = reply.body["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "describe" and json.loads(call["function"]["arguments"])
    deltas = [
        d
        async for chunk in backend.stream(ChatRequest(SMALL, body, "req-image-3"))
        for choice in chunk.data.get("choices", ())
        for d in choice.get("delta", {}).get("tool_calls") or ()
    ]
    assert deltas[0]["function"]["name"] == "describe" and len(deltas) > 2
    assert (
        "".join(d["function"].get("arguments") or "" for d in deltas)
        == (call["function"]["arguments"])
    )
    refusing = VLLMBackend("text#0", text_only.base_url, text_only.http)
    with pytest.raises(BackendRejected):
        await refusing.chat(ChatRequest(SMALL, body, "req-image-4"))
