"""``POST /v1/chat/completions``: validate, wait for a slot, then answer in JSON or SSE.

Order of work for one request: read the JSON body; hold while a ``hang`` fault is on; answer
with an injected error if a fault says so (``refuses_prefill`` looks at the body); validate
(400: image parts too, on a profile without vision), check the model (404) and the context
window (400, image tokens counted); then take an engine slot (FIFO; 503 when the waiting queue
is capped and full) and answer at the profile's pace. Every outcome, errors included, is one
usage-log line.

Prefix cache: the slot comes with KV blocks, and the prompt tokens already cached
(``backends.sim.prefix_cache``) need no prefill, so the time to first token counts only the
rest. The tokens the answer computed are cached when it ends (all of them after a natural end;
without the last one sampled after a cut).

Pacing: the first token is due ``ttft x time_scale`` after the slot is granted, each next one
``itl x time_scale`` later (or the fixed wall-clock ``--ttft-ms`` / ``--itl-ms``, when given). A
stream sleeps only when the next token is more than 2 ms away, and writes every token that is due
in one socket write, so at small time scales it sends bursts and at ``time_scale=0`` (without
fixed latencies) the whole answer in one write with no sleep at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from backends.sim.answers import Answer
from backends.sim.engine import QueueFull
from backends.sim.errors import (
    SimError,
    context_length_exceeded,
    error_response,
    model_not_found,
    overloaded,
)
from backends.sim.faults import Faults, fault_error, prefill_refused
from backends.sim.output import choice_answers
from backends.sim.profiles import Flavor
from backends.sim.request import Message, parse_chat_request
from backends.sim.state import SIM_STATE, SimState
from backends.sim.tokens import chat_tokens, tokenize
from backends.sim.usage_log import UsageRecord
from backends.sim.wire import DONE, ChunkEncoder, completion_body

__all__ = ["chat_completions"]

_NATURAL = ("stop", "tool_calls")
"""Finish reasons after which the last token sampled was the end of turn."""

_MIN_SLEEP_S = 0.002
_GONE_POLL_S = 0.05
"""How often a stalled answer looks whether its client has gone."""


@dataclass(frozen=True, slots=True)
class _Job:
    request_id: str
    arrived: float
    stream: bool
    include_usage: bool
    prompt: list[str]
    """The prompt's tokens (``backends.sim.tokens.chat_tokens``)."""
    answers: tuple[Answer, ...]
    """One per choice (``n``)."""
    faults: Faults
    continuous_usage: bool = False
    """Usage in every chunk (vLLM's ``stream_options.continuous_usage_stats``)."""
    top_logprobs: int | None = None
    """With ``logprobs``: alternatives per token; ``None``: no logprobs."""

    @property
    def answer(self) -> Answer:
        """The first choice's answer (the one that drives the prefix cache)."""
        return self.answers[0]

    @property
    def steps(self) -> int:
        """Decoding steps: the longest choice's pieces (the choices decode side by side)."""
        return max(len(a.pieces) for a in self.answers)

    @property
    def total_tokens(self) -> int:
        """Completion tokens of every choice (vLLM's ``usage.completion_tokens``)."""
        return sum(len(a.pieces) for a in self.answers)

    @property
    def completion_id(self) -> str:
        return f"chatcmpl-{self.request_id}"

    def body(self, model: str, flavor: Flavor) -> bytes:
        return completion_body(
            completion_id=self.completion_id,
            model=model,
            flavor=flavor,
            answers=self.answers,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.total_tokens,
            top_logprobs=self.top_logprobs,
        )

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt)


def _computed(pieces: Sequence[str], natural_end: bool) -> list[str]:
    """The answer's tokens whose KV was computed: all of them after a natural end (the last
    token sampled was the end of turn, which the text does not show), else all but the last one
    sampled (never fed back through the model)."""
    tokens = tokenize("".join(pieces))
    return tokens if natural_end else tokens[:-1]


def _success_reason(finish_reason: str) -> str:
    """The engine's ``finished_reason`` (a tool call is a natural stop to the engine)."""
    return "stop" if finish_reason == "tool_calls" else finish_reason


def _plan(state: SimState, body: Any, request_id: str, arrived: float, faults: Faults) -> _Job:
    p = state.profile
    req = parse_chat_request(body, supports_continuation=p.supports_continuation)
    if req.model is not None and req.model != p.name:
        raise model_not_found(p.flavor, req.model)
    if p.kind == "embedding":
        raise SimError(400, "The model does not support Chat Completions API")
    rendered = req.messages
    if req.tools_text:  # the template renders the tool definitions into the prompt
        rendered = (Message("system", req.tools_text), *rendered)
    if req.image_tokens and not p.vision:
        raise SimError(400, f"{p.name} is a text-only model: image input is not supported",
                       param="messages", openai_code="invalid_value")  # fmt: skip
    tokens = chat_tokens(rendered, continue_final=req.continue_final)
    if req.image_tokens:  # the images' tokens follow the start of the prompt
        tokens[1:1] = ["<|image|>"] * req.image_tokens
    prompt = len(tokens)
    room = p.max_model_len - prompt
    if (req.max_tokens is None and room < 1) or (req.max_tokens or 0) > room:
        raise context_length_exceeded(
            p.flavor, limit=p.max_model_len, prompt_tokens=prompt, max_tokens=req.max_tokens
        )
    limit = req.max_tokens if req.max_tokens is not None else room
    if faults.content_filter:
        answers: tuple[Answer, ...] = (Answer((), "content_filter"),) * req.n
    else:
        lengths = {"min_tokens": p.min_output_tokens, "max_tokens": p.max_output_tokens}
        answers = choice_answers(req, lengths=lengths, limit=limit)
    continuous = req.continuous_usage and p.flavor == "vllm"  # hosted APIs have no such option
    top = req.top_logprobs if req.logprobs else None
    return _Job(
        request_id, arrived, req.stream, req.include_usage, tokens, answers, faults, continuous,
        top,
    )  # fmt: skip


def _log(state: SimState, job_or_id: _Job | str, stream: bool, status: int, **fields: Any) -> None:
    request_id = job_or_id if isinstance(job_or_id, str) else job_or_id.request_id
    state.usage.write(UsageRecord(request_id, state.profile.name, stream, status, **fields))


def _drop(request: web.Request, *, flush: bool = False) -> web.StreamResponse:
    """Close the connection without (the rest of) an answer: reset it at once, or with
    ``flush`` after what was written reaches the client (a body cut off at a known token)."""
    if request.transport is not None:
        if flush:
            request.transport.close()
        else:
            request.transport.abort()
    return web.StreamResponse()


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = request.app[SIM_STATE]
    arrived = asyncio.get_running_loop().time()
    request_id = request.headers.get("x-request-id") or f"sim-{uuid.uuid4().hex}"
    stream = False
    try:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            raise SimError(400, f"The request body is not valid JSON: {exc}") from None
        stream = isinstance(body, dict) and body.get("stream") is True
        if state.faults.current.hang:
            await state.faults.wait_released()
            if state.faults.closing:
                return _drop(request)
        faults = state.faults.current
        if faults.reset:
            _log(state, request_id, stream, 0, fault="reset")
            return _drop(request)
        injected = fault_error(
            faults,
            state.rng,
            flavor=state.profile.flavor,
            model=state.profile.name,
            flap_fails=state.faults.flap_fails(),
        )
        if injected is not None:
            raise injected
        refused = prefill_refused(faults, body)
        if refused is not None:
            raise refused
        job = _plan(state, body, request_id, arrived, faults)
    except SimError as err:
        _log(state, request_id, stream, err.status, fault=err.fault)
        response = error_response(state.profile.flavor, err)
        response.headers["x-request-id"] = request_id
        return response
    if job.stream:
        return await _stream(request, state, job)
    return await _complete(request, state, job)


def _queue_full(state: SimState, job: _Job) -> web.Response:
    _log(state, job, job.stream, 503)
    response = error_response(state.profile.flavor, overloaded(state.profile.flavor, 1.0))
    response.headers["x-request-id"] = job.request_id
    return response


async def _complete(request: web.Request, state: SimState, job: _Job) -> web.StreamResponse:
    loop = asyncio.get_running_loop()
    engine, metrics = state.engine, state.metrics
    pieces, steps = job.answer.pieces, job.steps
    cut = job.faults.cut_after_tokens
    cutting = cut is not None and cut < steps
    stall_at = job.faults.stall_after_tokens
    if not cutting and stall_at and stall_at < steps:
        return await _stalled_complete(request, state, job, stall_at)
    generated = cut if cut is not None and cutting else steps
    tokens = _tokens_at(job, generated)
    natural_end = not cutting and job.answer.finish_reason in _NATURAL
    try:
        async with engine.slot(job.prompt, job.total_tokens) as kv:
            admitted = loop.time()
            metrics.prompt_tokens += job.prompt_tokens
            ttft = state.ttft_s(kv.prefill_tokens) + job.faults.slow_first_token_ms / 1e3
            itl = state.itl_s()
            delay = ttft + itl * max(0, generated - 1)
            if delay > 0:
                await asyncio.sleep(delay)
            kv.generated = _computed(pieces[:generated], natural_end)
    except QueueFull:
        return _queue_full(state, job)
    metrics.generation_tokens += tokens
    if generated:
        metrics.ttft.observe(admitted - job.arrived + ttft)
        metrics.itl.observe(itl, generated - 1)
    metrics.e2e.observe(loop.time() - job.arrived)
    body = job.body(state.profile.name, state.profile.flavor)
    usage = {
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": tokens,
        "cached_tokens": kv.cached_tokens,
    }
    headers = {"x-request-id": job.request_id}
    if cutting:
        metrics.success["abort"] += 1
        _log(state, job, False, 200, **usage, finish_reason="abort", fault="cut_after_tokens")
        response = web.StreamResponse(headers=headers)
        response.content_type = "application/json"
        response.content_length = len(body)
        await response.prepare(request)
        await response.write(body[: len(body) // 2])
        return _drop(request)
    if _gone(request):
        # vLLM aborts a non-streamed request whose client disconnected: nobody got the answer.
        metrics.success["abort"] += 1
        _log(state, job, False, 200, **usage, finish_reason="abort")
        return _drop(request)
    if job.faults.malformed_after_tokens is not None:
        body = body[: len(body) // 2]  # well framed, but not JSON: no client can read it
        metrics.success["abort"] += 1
        _log(state, job, False, 200, **usage, finish_reason="abort", fault="malformed_after_tokens")
        return web.Response(body=body, content_type="application/json", headers=headers)
    metrics.success[_success_reason(job.answer.finish_reason)] += 1
    _log(state, job, False, 200, **usage, finish_reason=job.answer.finish_reason)
    return web.Response(body=body, content_type="application/json", headers=headers)


def _tokens_at(job: _Job, steps: int) -> int:
    """Completion tokens of every choice after ``steps`` decoding steps."""
    return sum(min(steps, len(a.pieces)) for a in job.answers)


async def _stalled_complete(
    request: web.Request, state: SimState, job: _Job, stall_at: int
) -> web.StreamResponse:
    """A non-streamed answer held by ``stall_after_tokens``: the status and headers go out when
    its slot is granted, then the engine stalls after ``stall_at`` tokens for ``stall_ms``, then
    generates the rest and the body follows. A client that leaves during the stall aborts it
    (logged with the tokens generated so far)."""
    loop = asyncio.get_running_loop()
    engine, metrics = state.engine, state.metrics
    pieces, finish_reason, steps = job.answer.pieces, job.answer.finish_reason, job.steps
    body = job.body(state.profile.name, state.profile.flavor)
    response = web.StreamResponse(headers={"x-request-id": job.request_id})
    response.content_type = "application/json"
    response.content_length = len(body)
    generated, cached = stall_at, 0
    try:
        async with engine.slot(job.prompt, job.total_tokens) as kv:
            admitted = loop.time()
            metrics.prompt_tokens += job.prompt_tokens
            await response.prepare(request)  # a 200 and headers, then no body for a while
            ttft = state.ttft_s(kv.prefill_tokens) + job.faults.slow_first_token_ms / 1e3
            itl = state.itl_s()
            await asyncio.sleep(ttft + itl * (stall_at - 1))
            if await _stall(request, job.faults.stall_ms / 1e3):
                await asyncio.sleep(itl * (steps - stall_at))
                generated = steps
            natural_end = generated == steps and finish_reason in _NATURAL
            kv.generated = _computed(pieces[:generated], natural_end)
            cached = kv.cached_tokens
    except QueueFull:
        return _queue_full(state, job)
    metrics.generation_tokens += _tokens_at(job, generated)
    metrics.ttft.observe(admitted - job.arrived + ttft)
    metrics.itl.observe(itl, generated - 1)
    metrics.e2e.observe(loop.time() - job.arrived)
    usage = {
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": _tokens_at(job, generated),
        "cached_tokens": cached,
    }
    if generated < steps:
        metrics.success["abort"] += 1
        _log(state, job, False, 200, **usage, finish_reason="abort", fault="stall_after_tokens")
        return _drop(request)
    metrics.success[_success_reason(finish_reason)] += 1
    _log(state, job, False, 200, **usage, finish_reason=finish_reason)
    with contextlib.suppress(ConnectionResetError):  # the client left after the stall
        await response.write(body)
        await response.write_eof()
    return response


class _Emitter:
    """Buffers due SSE chunks and writes them in one go, keeping the metrics as it does."""

    def __init__(self, response: web.StreamResponse, state: SimState, job: _Job) -> None:
        self._response = response
        self._state = state
        self._job = job
        self._buf: list[bytes] = []
        self._pending = 0
        self._itl_sum = 0.0
        self._itl_count = 0
        self.sent = 0
        """Content tokens written to the socket (every choice's)."""
        self.steps = 0
        """Decoding steps added (each a piece of every choice still going)."""

    def add(self, chunk: bytes, *, tokens: int = 0, itl: float | None = None) -> None:
        self._buf.append(chunk)
        self._pending += tokens
        if itl is not None:
            self._itl_sum += itl
            self._itl_count += 1

    async def flush(self) -> None:
        if not self._buf:
            return
        data = b"".join(self._buf)
        self._buf.clear()
        metrics = self._state.metrics
        if self.sent == 0 and self._pending:
            metrics.ttft.observe(asyncio.get_running_loop().time() - self._job.arrived)
        if self._itl_count:
            metrics.itl.observe(self._itl_sum / self._itl_count, self._itl_count)
            self._itl_sum, self._itl_count = 0.0, 0
        await self._response.write(data)
        self.sent += self._pending
        metrics.generation_tokens += self._pending
        self._pending = 0


class _LeftInStall(ConnectionResetError):
    """The client went away while a ``stall_after_tokens`` fault held the answer."""


def _gone(request: web.Request) -> bool:
    """Whether the client has closed the connection."""
    transport = request.transport
    return transport is None or transport.is_closing()


async def _stall(request: web.Request, seconds: float) -> bool:
    """Stay silent for ``seconds`` (wall clock), or until the client has gone (vLLM aborts a
    request whose connection closed); whether the client is still there."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while (left := end - loop.time()) > 0:
        if _gone(request):
            return False
        await asyncio.sleep(min(left, _GONE_POLL_S))
    return not _gone(request)


async def _emit(
    request: web.Request,
    emitter: _Emitter,
    state: SimState,
    job: _Job,
    count: int,
    prefill_tokens: int,
) -> None:
    """Pace and write the role chunks and the first ``count`` decoding steps (a piece of every
    choice still going); the first is due after the prefill of ``prefill_tokens``."""
    loop = asyncio.get_running_loop()
    enc = ChunkEncoder(
        completion_id=job.completion_id, model=state.profile.name, flavor=state.profile.flavor
    )
    answers, steps, top = job.answers, job.steps, job.top_logprobs
    prompt = job.prompt_tokens if job.continuous_usage else None
    opening = None if prompt is None else (prompt, 0)
    due = loop.time() + state.ttft_s(prefill_tokens)
    due += job.faults.slow_first_token_ms / 1e3
    stall_at = job.faults.stall_after_tokens
    for i in range(count):
        if i == stall_at and i:
            await emitter.flush()
            if not await _stall(request, job.faults.stall_ms / 1e3):
                raise _LeftInStall("the client left during the stall")
            due = loop.time()
        itl = None
        if i:
            itl = state.itl_s()
            due += itl
        wait = due - loop.time()
        if wait > _MIN_SLEEP_S:
            await emitter.flush()
            await asyncio.sleep(wait)
        if i == 0:
            _open(emitter, enc, answers, opening)
        _step(emitter, enc, answers, i, prompt, top, itl)
    if steps == 0:  # nothing left to say (a continuation of a complete answer)
        await asyncio.sleep(max(0.0, due - loop.time()))
        _open(emitter, enc, answers, opening)
    if count < steps:
        if count == 0:
            await asyncio.sleep(max(0.0, due - loop.time()))
            _open(emitter, enc, answers, opening)
        await emitter.flush()
        return
    if job.include_usage:
        emitter.add(enc.usage(job.prompt_tokens, job.total_tokens))
    if not job.faults.omit_done:
        emitter.add(DONE)
    await emitter.flush()


def _step(
    emitter: _Emitter,
    enc: ChunkEncoder,
    answers: tuple[Answer, ...],
    i: int,
    prompt: int | None,
    top: int | None,
    itl: float | None,
) -> None:
    """Decoding step ``i``: the piece of every choice still going."""
    for index, answer in enumerate(answers):
        if i >= len(answer.pieces):
            continue
        usage = None if prompt is None else (prompt, i + 1)
        finish = answer.finish_reason if i == len(answer.pieces) - 1 else None
        chunk = enc.piece(
            answer, i, index=index, finish_reason=finish, usage=usage, top_logprobs=top
        )
        emitter.add(chunk, tokens=1, itl=itl if index == 0 else None)
    emitter.steps = i + 1


def _open(
    emitter: _Emitter,
    enc: ChunkEncoder,
    answers: tuple[Answer, ...],
    opening: tuple[int, int] | None,
) -> None:
    """Each choice's role chunk; a choice with nothing to say ends at once."""
    for index in range(len(answers)):
        emitter.add(enc.role(opening, index=index))
    for index, answer in enumerate(answers):
        if not answer.pieces:
            emitter.add(enc.finish(answer.finish_reason, opening, index=index))


def _early_end(faults: Faults, length: int) -> tuple[int, str | None]:
    """How many pieces a stream sends, and which fault ends it early (if one does)."""
    ends = [
        (n, name)
        for n, name in (
            (faults.cut_after_tokens, "cut_after_tokens"),
            (faults.malformed_after_tokens, "malformed_after_tokens"),
            (faults.end_after_tokens, "end_after_tokens"),
        )
        if n is not None and n < length
    ]
    if not ends:
        return length, None
    return min(ends)


async def _stream(request: web.Request, state: SimState, job: _Job) -> web.StreamResponse:
    engine, metrics = state.engine, state.metrics
    pieces = job.answer.pieces
    count, early = _early_end(job.faults, job.steps)
    try:
        engine.check_admission()
    except QueueFull:
        return _queue_full(state, job)
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
            "x-request-id": job.request_id,
        }
    )
    emitter = _Emitter(response, state, job)
    finish_reason = job.answer.finish_reason
    fault: str | None = None
    cached = 0
    try:
        await response.prepare(request)
        async with engine.slot(job.prompt, job.total_tokens, bounded=False) as kv:
            cached = kv.cached_tokens
            metrics.prompt_tokens += job.prompt_tokens
            try:
                await _emit(request, emitter, state, job, count, kv.prefill_tokens)
            finally:
                sent = min(emitter.steps, len(pieces))
                natural_end = emitter.sent == job.total_tokens and finish_reason in _NATURAL
                kv.generated = _computed(pieces[:sent], natural_end)
    except ConnectionResetError as exc:
        finish_reason = "abort"  # the client went away
        fault = "stall_after_tokens" if isinstance(exc, _LeftInStall) else None
    metrics.e2e.observe(asyncio.get_running_loop().time() - job.arrived)
    usage = {
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": emitter.sent,
        "cached_tokens": cached,
    }
    if early is not None and finish_reason != "abort":
        metrics.success["abort"] += 1
        _log(state, job, True, 200, **usage, finish_reason="abort", fault=early)
        if early == "cut_after_tokens":
            return _drop(request, flush=True)
        with contextlib.suppress(ConnectionResetError):
            if early == "malformed_after_tokens":
                await response.write(b'data: {"id": "chatcmpl-broken", "choices": [\n\n')
            await response.write_eof()
        return response
    metrics.success[_success_reason(finish_reason)] += 1
    _log(state, job, True, 200, **usage, finish_reason=finish_reason, fault=fault)
    if finish_reason != "abort":
        with contextlib.suppress(ConnectionResetError):  # the client left after [DONE]
            await response.write_eof()
    return response
