"""The simulator's chat API through the official openai client: determinism, streaming, limits,
continuation and the error bodies."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from backends.sim import PROFILES, create_sim_app
from backends.sim.tokens import count_tokens
from tests.backends.conftest import EXTERNAL, LARGE, SMALL, RunningSim, StartSim, profile

QUESTION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "How do routers pick a model tier?"},
]


async def _complete(sim: RunningSim, messages: list[dict[str, Any]], **kw: Any) -> Any:
    async with sim.client() as client:
        return await client.chat.completions.create(model=sim.profile.name, messages=messages, **kw)


async def _stream(
    sim: RunningSim, messages: list[dict[str, Any]], **kw: Any
) -> list[openai.types.chat.ChatCompletionChunk]:
    async with sim.client() as client:
        stream = await client.chat.completions.create(
            model=sim.profile.name, messages=messages, stream=True, **kw
        )
        return [chunk async for chunk in stream]


def _text(chunks: list[openai.types.chat.ChatCompletionChunk]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


async def test_answers_are_deterministic_and_counted_by_the_rule(start_sim: StartSim) -> None:
    sim = await start_sim()
    first = await _complete(sim, QUESTION)
    again = await _complete(sim, QUESTION)
    seeded = await _complete(sim, QUESTION, seed=7)
    other = await _complete(sim, [{"role": "user", "content": "Something else entirely."}])

    text = first.choices[0].message.content
    assert text == again.choices[0].message.content
    assert first.usage == again.usage
    assert text != seeded.choices[0].message.content
    assert text != other.choices[0].message.content
    assert first.object == "chat.completion" and first.model == SMALL
    assert first.choices[0].finish_reason == "stop"
    assert first.usage is not None
    assert 20 <= first.usage.completion_tokens <= 300
    assert count_tokens(text) == first.usage.completion_tokens
    # 1 BOS + 2 x (4 + content) + 3 for the generation prompt
    content = sum(count_tokens(m["content"]) for m in QUESTION)
    assert first.usage.prompt_tokens == 1 + 2 * 4 + content + 3
    assert first.usage.total_tokens == first.usage.prompt_tokens + first.usage.completion_tokens


async def test_answer_does_not_depend_on_the_profile(start_sim: StartSim) -> None:
    small, large = await start_sim(PROFILES[SMALL]), await start_sim(PROFILES[LARGE])
    a, b = await _complete(small, QUESTION), await _complete(large, QUESTION)
    assert a.choices[0].message.content == b.choices[0].message.content


async def test_content_parts_read_like_a_string(start_sim: StartSim) -> None:
    sim = await start_sim()
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hi there."}]}]
    plain = [{"role": "user", "content": "Hi there."}]
    a, b = await _complete(sim, parts), await _complete(sim, plain)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage == b.usage


async def test_stream_matches_the_json_answer(start_sim: StartSim) -> None:
    sim = await start_sim()
    whole = await _complete(sim, QUESTION)
    chunks = await _stream(sim, QUESTION, stream_options={"include_usage": True})

    assert all(c.object == "chat.completion.chunk" and c.model == SMALL for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    *body, last_content, usage_chunk = chunks
    assert all(c.choices[0].finish_reason is None for c in body)
    assert last_content.choices[0].finish_reason == "stop"
    assert last_content.choices[0].delta.content
    assert usage_chunk.choices == [] and usage_chunk.usage == whole.usage
    assert _text(chunks) == whole.choices[0].message.content
    assert whole.usage is not None
    assert len(chunks) == whole.usage.completion_tokens + 2  # role chunk + one per token + usage

    plain = await _stream(sim, QUESTION)
    assert plain[-1].choices[0].finish_reason == "stop"
    assert all(c.usage is None for c in plain)


async def test_continuous_usage_stats_in_every_chunk(start_sim: StartSim) -> None:
    """vLLM's ``continuous_usage_stats`` (with ``include_usage``): every chunk carries the
    prompt tokens and the completion tokens so far; a hosted API has no such option."""
    both = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    sim = await start_sim()
    chunks = await _stream(sim, QUESTION, extra_body=both)
    *answer, final = chunks
    assert final.choices == [] and final.usage is not None
    prompt = final.usage.prompt_tokens
    assert [c.usage.completion_tokens if c.usage else None for c in answer] == list(
        range(len(answer))
    )  # the role chunk's 0, then one more per token
    assert all(c.usage and c.usage.prompt_tokens == prompt for c in answer)
    assert answer[-1].usage == final.usage
    alone = {"stream_options": {"continuous_usage_stats": True}}  # needs include_usage
    assert all(c.usage is None for c in await _stream(sim, QUESTION, extra_body=alone))
    hosted = await start_sim(profile(EXTERNAL))
    *answer, final = await _stream(hosted, QUESTION, extra_body=both)
    assert final.usage is not None and all(c.usage is None for c in answer)


@pytest.mark.parametrize("key", ["max_tokens", "max_completion_tokens"])
async def test_max_tokens_cuts_with_length(start_sim: StartSim, key: str) -> None:
    sim = await start_sim()
    whole = await _complete(sim, QUESTION)
    cut = await _complete(sim, QUESTION, **{key: 5})
    assert cut.choices[0].finish_reason == "length"
    assert cut.usage is not None and cut.usage.completion_tokens == 5
    assert whole.choices[0].message.content.startswith(cut.choices[0].message.content)

    chunks = await _stream(sim, QUESTION, stream_options={"include_usage": True}, **{key: 5})
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    assert _text(chunks) == cut.choices[0].message.content


async def test_stop_string_ends_the_answer_early(start_sim: StartSim) -> None:
    sim = await start_sim()
    whole = (await _complete(sim, QUESTION)).choices[0].message.content
    stopped = await _complete(sim, QUESTION, stop=["."])
    text = stopped.choices[0].message.content
    assert stopped.choices[0].finish_reason == "stop"
    assert "." not in text and whole.startswith(text) and len(text) < len(whole)


async def test_unknown_fields_are_ignored_and_bad_n_is_refused(start_sim: StartSim) -> None:
    sim = await start_sim()
    ok = await sim.post_chat(
        {"model": SMALL, "messages": QUESTION, "top_k": 5, "guided_json": None, "n": 1}
    )
    assert ok.status == 200
    with pytest.raises(openai.BadRequestError) as exc:
        await _complete(sim, QUESTION, n=0)
    assert exc.value.status_code == 400
    bad = await sim.post_chat({"model": SMALL, "messages": []})
    assert bad.status == 400


async def test_context_length_error_in_vllm_shape(start_sim: StartSim) -> None:
    sim = await start_sim(profile(SMALL, max_model_len=100))
    prompt = [{"role": "user", "content": "word " * 60}]  # 1 + 4 + 60 + 3 = 68 tokens
    resp = await sim.post_chat({"model": SMALL, "messages": prompt, "max_tokens": 40})
    assert resp.status == 400
    assert await resp.json() == {
        "error": {
            "message": "This model's maximum context length is 100 tokens. However, you "
            "requested 40 output tokens and your prompt contains 68 input tokens, for a total "
            "of 108 tokens. Please reduce the length of the input prompt or the number of "
            "requested output tokens.",
            "type": "BadRequestError",
            "param": "input_tokens",
            "code": 400,
        }
    }
    assert (
        await sim.post_chat({"model": SMALL, "messages": prompt, "max_tokens": 32})
    ).status == 200

    long_prompt = [{"role": "user", "content": "word " * 100}]
    resp = await sim.post_chat({"model": SMALL, "messages": long_prompt})
    body = await resp.json()
    assert resp.status == 400
    assert body["error"]["message"].startswith(
        "This model's maximum context length is 100 tokens. However, your request has 108 "
        "input tokens."
    )
    with pytest.raises(openai.BadRequestError) as exc:
        await _complete(sim, prompt, max_tokens=40)
    assert "maximum context length is 100 tokens" in exc.value.message


async def test_without_max_tokens_the_answer_fits_the_window(start_sim: StartSim) -> None:
    sim = await start_sim(profile(SMALL, max_model_len=20))
    answer = await _complete(sim, [{"role": "user", "content": "Hi."}])  # 10 prompt tokens
    assert answer.usage is not None and answer.usage.completion_tokens == 10
    assert answer.choices[0].finish_reason == "length"


async def test_openai_flavour_errors(start_sim: StartSim) -> None:
    sim = await start_sim(profile(EXTERNAL, max_model_len=50))
    prompt = [{"role": "user", "content": "word " * 40}]
    resp = await sim.post_chat({"model": EXTERNAL, "messages": prompt, "max_tokens": 10})
    assert resp.status == 400
    assert await resp.json() == {
        "error": {
            "message": "This model's maximum context length is 50 tokens. However, you "
            "requested 58 tokens (48 in the messages, 10 in the completion). Please reduce the "
            "length of the messages or completion.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    resp = await sim.post_chat({"model": "gpt-5", "messages": QUESTION})
    assert resp.status == 404
    assert (await resp.json())["error"] == {
        "message": "The model `gpt-5` does not exist or you do not have access to it.",
        "type": "invalid_request_error",
        "param": None,
        "code": "model_not_found",
    }


async def test_unknown_model_is_404_in_vllm_shape(start_sim: StartSim) -> None:
    sim = await start_sim()
    resp = await sim.post_chat({"model": "llama-9", "messages": QUESTION})
    assert resp.status == 404
    assert await resp.json() == {
        "error": {
            "message": "The model `llama-9` does not exist.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }
    async with sim.client() as client:
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="llama-9", messages=QUESTION)
    async with sim.http.post(f"{sim.base_url}/v1/chat/completions", data=b"{nope") as bad:
        assert bad.status == 400


async def test_models_and_health(start_sim: StartSim) -> None:
    sim = await start_sim()
    async with sim.client() as client:
        models = await client.models.list()
    assert [m.id for m in models.data] == [SMALL]
    assert models.data[0].model_extra == {
        "root": SMALL,
        "parent": None,
        "max_model_len": 16384,
        "permission": models.data[0].model_extra["permission"],
    }
    async with sim.http.get(f"{sim.base_url}/health") as resp:
        assert resp.status == 200 and await resp.read() == b""


def _continue(messages: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    return {
        "messages": [*messages, {"role": "assistant", "content": prefix}],
        "extra_body": {"continue_final_message": True, "add_generation_prompt": False},
    }


@pytest.mark.parametrize("cut", ["pieces", "mid-word", "empty", "all"])
async def test_continuation_produces_the_rest(start_sim: StartSim, cut: str) -> None:
    sim = await start_sim()
    whole = await _complete(sim, QUESTION)
    full = whole.choices[0].message.content
    assert whole.usage is not None
    words = full.split(" ")
    prefix = {
        "pieces": " ".join(words[:6]),
        "mid-word": " ".join(words[:6]) + " " + words[6][:2],
        "empty": "",
        "all": full,
    }[cut]
    rest = await _complete(sim, **_continue(QUESTION, prefix))
    assert prefix + rest.choices[0].message.content == full
    assert rest.choices[0].finish_reason == "stop"
    assert rest.usage is not None
    assert rest.usage.prompt_tokens == whole.usage.prompt_tokens + count_tokens(prefix)
    assert count_tokens(rest.choices[0].message.content) == rest.usage.completion_tokens

    chunks = await _stream(
        sim, stream_options={"include_usage": True}, **_continue(QUESTION, prefix)
    )
    assert prefix + _text(chunks) == full
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].usage == rest.usage


async def test_continuation_rules(start_sim: StartSim) -> None:
    sim = await start_sim()
    messages = [*QUESTION, {"role": "assistant", "content": "Nothing like the answer"}]
    body = {"model": SMALL, "messages": messages, "continue_final_message": True}
    assert (await sim.post_chat(body)).status == 400  # add_generation_prompt defaults to true
    body["add_generation_prompt"] = False
    first, second = await sim.post_chat(body), await sim.post_chat(body)
    assert first.status == 200
    assert (
        await first.json() != {}
        and (await first.json())["choices"] == (await second.json())["choices"]
    )

    external = await start_sim(PROFILES[EXTERNAL])
    full = (await _complete(external, QUESTION)).choices[0].message.content
    ignored = await _complete(external, **_continue(QUESTION, full[:10]))
    assert not full.startswith(full[:10] + ignored.choices[0].message.content)


def test_factory_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="time_scale"):
        create_sim_app(PROFILES[SMALL], time_scale=-1)
    with pytest.raises(TypeError):
        PROFILES["x"] = PROFILES[SMALL]
    assert {p.name for p in PROFILES.values()} == {SMALL, LARGE, EXTERNAL, "bge-m3"}
