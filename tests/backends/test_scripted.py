"""``ScriptedBackend``: answers in script order or from a function, pauses through the injected
sleep, errors raised where the script puts them (before a stream, or in its middle), every call
recorded; a script used wrong fails loudly."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from backends import Backend, ScriptedBackend
from backends.errors import (
    BackendError,
    BackendRateLimited,
    BackendStreamCut,
    BackendUnavailable,
)
from backends.scripted import Answer, Pause, ScriptExhausted, reply, stream_of
from backends.types import ChatChunk, ChatRequest, Usage


def request(content: str = "hi", *, request_id: str = "r1") -> ChatRequest:
    return ChatRequest(
        model="m", body={"messages": [{"role": "user", "content": content}]}, request_id=request_id
    )


async def collect(backend: ScriptedBackend, req: ChatRequest) -> list[ChatChunk]:
    return [chunk async for chunk in backend.stream(req)]


def text(chunks: Sequence[ChatChunk]) -> str:
    return "".join(
        choice["delta"].get("content") or "" for c in chunks for choice in c.data["choices"]
    )


class Sleeps:
    """Stands in for ``asyncio.sleep``: keeps the pauses asked for, takes none."""

    def __init__(self) -> None:
        self.taken: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.taken.append(seconds)


def test_it_is_a_backend() -> None:
    backend = ScriptedBackend("small#0", [], address="10.0.0.5:8000")
    assert isinstance(backend, Backend)
    assert (backend.name, backend.address) == ("small#0", "10.0.0.5:8000")


async def test_answers_come_in_script_order_and_every_call_is_recorded() -> None:
    backend = ScriptedBackend(
        "b", [reply("first"), stream_of("sec", "ond"), reply("third", completion_tokens=7)]
    )
    one = await backend.chat(request(request_id="a"))
    two = await collect(backend, request(request_id="b"))
    three = await backend.chat(request(request_id="c"))
    assert one.body["choices"][0]["message"]["content"] == "first"
    assert text(two) == "second"
    assert three.usage == Usage(10, 7)
    assert [(c.kind, c.request.request_id) for c in backend.calls] == [
        ("chat", "a"),
        ("stream", "b"),
        ("chat", "c"),
    ]
    assert [r.request_id for r in backend.requests] == ["a", "b", "c"]


async def test_a_call_past_the_script_is_a_test_error_not_a_backend_error() -> None:
    backend = ScriptedBackend("b", [reply("only")])
    await backend.chat(request())
    with pytest.raises(ScriptExhausted, match="call 2") as caught:
        await backend.chat(request())
    assert not isinstance(caught.value, BackendError)  # nothing above a backend handles it


async def test_a_function_answers_from_the_request() -> None:
    def answer(req: ChatRequest) -> Answer:
        content = req.body["messages"][-1]["content"]
        return BackendUnavailable("down", status=503) if content == "fail" else reply(content)

    backend = ScriptedBackend("b", answer)
    echoed = await backend.chat(request("echo me"))
    assert echoed.body["choices"][0]["message"]["content"] == "echo me"
    with pytest.raises(BackendUnavailable):
        await backend.chat(request("fail"))
    assert len(backend.calls) == 2  # a function never runs out


async def test_an_async_function_is_awaited() -> None:
    async def answer(req: ChatRequest) -> Answer:
        return reply(req.request_id)

    response = await ScriptedBackend("b", answer).chat(request(request_id="r9"))
    assert response.body["choices"][0]["message"]["content"] == "r9"


async def test_an_error_is_raised_with_the_backends_name_unless_it_has_one() -> None:
    backend = ScriptedBackend(
        "small#0",
        [BackendRateLimited("slow down", status=429, retry_after=2.0), BackendUnavailable(
            "down", backend="other#1")],
    )  # fmt: skip
    with pytest.raises(BackendRateLimited) as limited:
        await backend.chat(request())
    assert (limited.value.backend, limited.value.retry_after) == ("small#0", 2.0)
    with pytest.raises(BackendUnavailable) as down:
        await backend.chat(request())
    assert down.value.backend == "other#1"


async def test_pauses_go_through_the_injected_sleep_in_order() -> None:
    sleeps = Sleeps()
    chunks = stream_of("a", "b", "c")
    backend = ScriptedBackend(
        "b",
        [[Pause(0.5), reply("late")], [chunks[0], Pause(2.0), *chunks[1:]]],
        sleep=sleeps,
    )
    assert (await backend.chat(request())).body["choices"][0]["message"]["content"] == "late"
    assert sleeps.taken == [0.5]
    seen: list[tuple[str, list[float]]] = []
    async for chunk in backend.stream(request()):
        seen.append((text([chunk]), list(sleeps.taken)))
    assert seen[:3] == [("a", [0.5]), ("b", [0.5, 2.0]), ("c", [0.5, 2.0])]  # the stall


async def test_a_stream_can_break_after_its_first_chunks() -> None:
    backend = ScriptedBackend("b", [[*stream_of("Hel", "lo")[:2], BackendStreamCut("cut")]])
    got: list[ChatChunk] = []
    with pytest.raises(BackendStreamCut):
        async for chunk in backend.stream(request()):
            got.append(chunk)
    assert text(got) == "Hello"


async def test_a_stream_fails_before_its_first_chunk() -> None:
    backend = ScriptedBackend("b", [BackendUnavailable("down", status=503)])
    with pytest.raises(BackendUnavailable):
        await collect(backend, request())


def test_a_streamed_answer_ends_with_its_finish_and_usage() -> None:
    chunks = stream_of("x", "y", prompt_tokens=4, model="m1")
    assert [c.data["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None, None, "stop"]
    assert chunks[-1].usage == Usage(4, 2) and chunks[-1].data["choices"] == []
    assert chunks[-1].data["usage"]["total_tokens"] == 6
    assert {c.data["model"] for c in chunks} == {"m1"}
    assert Usage.from_openai(reply("one two three").body["usage"]) == Usage(10, 3)


@pytest.mark.parametrize(
    ("kind", "answer", "message"),
    [
        ("chat", stream_of("a"), "cannot hold ChatChunk"),
        ("chat", [Pause(0.1)], "must end with a ChatResponse"),
        ("stream", reply("a"), "cannot hold ChatResponse"),
    ],
)
async def test_an_answer_of_the_wrong_kind_is_refused(
    kind: str, answer: Answer, message: str
) -> None:
    backend = ScriptedBackend("b", [answer], sleep=Sleeps())
    with pytest.raises(TypeError, match=message):
        if kind == "chat":
            await backend.chat(request())
        else:
            await collect(backend, request())


async def test_aclose_is_recorded() -> None:
    backend = ScriptedBackend("b", [])
    assert not backend.closed
    await backend.aclose()
    assert backend.closed
