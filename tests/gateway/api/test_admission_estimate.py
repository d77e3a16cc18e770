"""The edge's prompt estimate (rate limits, budget reservations, the context check) counts a
request's tool definitions and images, and equals what a worker books for a hosted call that
reports no usage (``gateway.accounting.estimates``)."""

from __future__ import annotations

import orjson

from gateway.accounting.estimates import estimate
from gateway.api.admission import admit
from gateway.settings import LimitsSettings
from router.features import IMAGE_TOKENS, PromptFeatures, estimate_tokens
from tests.router.test_prompt_estimate import TOOL_CONVERSATION, WEATHER_TOOL


def test_the_edge_counts_tools_and_images_as_the_worker_does() -> None:
    photo = {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}}
    messages = [
        *TOOL_CONVERSATION,
        {"role": "user", "content": [{"type": "text", "text": "And here?"}, photo]},
    ]
    raw = orjson.dumps(
        {"model": "auto", "messages": messages, "tools": [WEATHER_TOOL], "max_tokens": 50}
    )
    admitted = admit(raw, {}, LimitsSettings())
    edge = admitted.features.estimated_prompt_tokens
    assert edge == estimate(admitted.body).prompt_tokens  # the body the worker gets
    assert edge > estimate_tokens(messages) > IMAGE_TOKENS
    assert edge > PromptFeatures.from_messages(messages).estimated_prompt_tokens
