"""``POST /v1/chat/completions``: validate, wait for a slot, then answer in JSON or SSE.

Order of work for one request: read the JSON body; hold while a ``hang`` fault is on; answer
with an injected error if a fault says so; validate (400), check the model (404) and the context
window (400); then take an engine slot (FIFO; 503 when the waiting queue is capped and full) and
answer at the profile's pace. Every outcome, errors included, is one usage-log line.

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

from backends.sim.answers import Answer, answer_pieces, continuation_pieces, finish
from backends.sim.engine import QueueFull
from backends.sim.errors import (
    SimError,
    context_length_exceeded,
    error_response,
    model_not_found,
    overloaded,
)
from backends.sim.faults import Faults, fault_error
from backends.sim.request import SimChatRequest, parse_chat_request
from backends.sim.state import SIM_STATE, SimState
from backends.sim.tokens import chat_tokens, tokenize
from backends.sim.usage_log import UsageRecord
from backends.sim.wire import DONE, ChunkEncoder, completion_body

__all__ = ["chat_completions"]

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
    answer: Answer
    faults: Faults
    continuous_usage: bool = False
    """Usage in every chunk (vLLM's ``stream_options.continuous_usage_stats``)."""

    @property
    def completion_id(self) -> str:
        return f"chatcmpl-{self.request_id}"

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt)


def _computed(pieces: Sequence[str], natural_end: bool) -> list[str]:
    """The answer's tokens whose KV was computed: all of them after a natural end (the last
    token sampled was the end of turn, which the text does not show), else all but the last one
    sampled (never fed back through the model)."""
    tokens = tokenize("".join(pieces))
    return tokens if natural_end else tokens[:-1]


def _natural_pieces(state: SimState, req: SimChatRequest) -> tuple[str, ...]:
    p = state.profile
    lengths = {"min_tokens": p.min_output_tokens, "max_tokens": p.max_output_tokens}
    if req.continue_final:
        full = answer_pieces(req.messages[:-1], req.seed, **lengths)
        rest = continuation_pieces(full, req.messages[-1].text)
        if rest is not None:
            return rest
    return answer_pieces(req.messages, req.seed, **lengths)


def _plan(state: SimState, body: Any, request_id: str, arrived: float, faults: Faults) -> _Job:
    p = state.profile
    req = parse_chat_request(body, supports_continuation=p.supports_continuation)
    if req.model is not None and req.model != p.name:
        raise model_not_found(p.flavor, req.model)
    tokens = chat_tokens(req.messages, continue_final=req.continue_final)
    prompt = len(tokens)
    room = p.max_model_len - prompt
    if (req.max_tokens is None and room < 1) or (req.max_tokens or 0) > room:
        raise context_length_exceeded(
            p.flavor, limit=p.max_model_len, prompt_tokens=prompt, max_tokens=req.max_tokens
        )
    limit = req.max_tokens if req.max_tokens is not None else room
    if faults.content_filter:
        answer = Answer((), "content_filter")
    else:
        answer = finish(_natural_pieces(state, req), stop=req.stop, limit=limit)
    continuous = req.continuous_usage and p.flavor == "vllm"  # hosted APIs have no such option
    return _Job(
        request_id, arrived, req.stream, req.include_usage, tokens, answer, faults, continuous
    )


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
    pieces = job.answer.pieces
    cut = job.faults.cut_after_tokens
    cutting = cut is not None and cut < len(pieces)
    stall_at = job.faults.stall_after_tokens
    if not cutting and stall_at and stall_at < len(pieces):
        return await _stalled_complete(request, state, job, stall_at)
    generated = cut if cut is not None and cutting else len(pieces)
    natural_end = not cutting and job.answer.finish_reason == "stop"
    try:
        async with engine.slot(job.prompt, len(pieces)) as kv:
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
    metrics.generation_tokens += generated
    if generated:
        metrics.ttft.observe(admitted - job.arrived + ttft)
        metrics.itl.observe(itl, generated - 1)
    metrics.e2e.observe(loop.time() - job.arrived)
    body = completion_body(
        completion_id=job.completion_id,
        model=state.profile.name,
        flavor=state.profile.flavor,
        text="".join(pieces),
        finish_reason=job.answer.finish_reason,
        prompt_tokens=job.prompt_tokens,
        completion_tokens=len(pieces),
    )
    usage = {
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": generated,
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
    if job.faults.malformed_after_tokens is not None:
        body = body[: len(body) // 2]  # well framed, but not JSON
    metrics.success[job.answer.finish_reason] += 1
    _log(state, job, False, 200, **usage, finish_reason=job.answer.finish_reason)
    return web.Response(body=body, content_type="application/json", headers=headers)


async def _stalled_complete(
    request: web.Request, state: SimState, job: _Job, stall_at: int
) -> web.StreamResponse:
    """A non-streamed answer held by ``stall_after_tokens``: the status and headers go out when
    its slot is granted, then the engine stalls after ``stall_at`` tokens for ``stall_ms``, then
    generates the rest and the body follows. A client that leaves during the stall aborts it
    (logged with the tokens generated so far)."""
    loop = asyncio.get_running_loop()
    engine, metrics = state.engine, state.metrics
    pieces, finish_reason = job.answer.pieces, job.answer.finish_reason
    body = completion_body(
        completion_id=job.completion_id,
        model=state.profile.name,
        flavor=state.profile.flavor,
        text="".join(pieces),
        finish_reason=finish_reason,
        prompt_tokens=job.prompt_tokens,
        completion_tokens=len(pieces),
    )
    response = web.StreamResponse(headers={"x-request-id": job.request_id})
    response.content_type = "application/json"
    response.content_length = len(body)
    generated, cached = stall_at, 0
    try:
        async with engine.slot(job.prompt, len(pieces)) as kv:
            admitted = loop.time()
            metrics.prompt_tokens += job.prompt_tokens
            await response.prepare(request)  # a 200 and headers, then no body for a while
            ttft = state.ttft_s(kv.prefill_tokens) + job.faults.slow_first_token_ms / 1e3
            itl = state.itl_s()
            await asyncio.sleep(ttft + itl * (stall_at - 1))
            if await _stall(request, job.faults.stall_ms / 1e3):
                await asyncio.sleep(itl * (len(pieces) - stall_at))
                generated = len(pieces)
            natural_end = generated == len(pieces) and finish_reason == "stop"
            kv.generated = _computed(pieces[:generated], natural_end)
            cached = kv.cached_tokens
    except QueueFull:
        return _queue_full(state, job)
    metrics.generation_tokens += generated
    metrics.ttft.observe(admitted - job.arrived + ttft)
    metrics.itl.observe(itl, generated - 1)
    metrics.e2e.observe(loop.time() - job.arrived)
    usage = {
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": generated,
        "cached_tokens": cached,
    }
    if generated < len(pieces):
        metrics.success["abort"] += 1
        _log(state, job, False, 200, **usage, finish_reason="abort", fault="stall_after_tokens")
        return _drop(request)
    metrics.success[finish_reason] += 1
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
        """Content tokens written to the socket."""

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
    """Pace and write the role chunk and the first ``count`` content pieces; the first is due
    after the prefill of ``prefill_tokens``."""
    loop = asyncio.get_running_loop()
    enc = ChunkEncoder(
        completion_id=job.completion_id, model=state.profile.name, flavor=state.profile.flavor
    )
    pieces, reason = job.answer.pieces, job.answer.finish_reason
    last = len(pieces) - 1 if count == len(pieces) else -1  # the piece that carries the reason
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
            emitter.add(enc.role(opening))
        usage = None if prompt is None else (prompt, i + 1)
        finish = reason if i == last else None
        emitter.add(enc.content(pieces[i], finish, usage), tokens=1, itl=itl)
    if not pieces:  # nothing left to say (a continuation of a complete answer)
        await asyncio.sleep(max(0.0, due - loop.time()))
        emitter.add(enc.role(opening))
        emitter.add(enc.content("", reason, opening))
    if count < len(pieces):
        if count == 0:
            await asyncio.sleep(max(0.0, due - loop.time()))
            emitter.add(enc.role(opening))
        await emitter.flush()
        return
    if job.include_usage:
        emitter.add(enc.usage(job.prompt_tokens, len(pieces)))
    if not job.faults.omit_done:
        emitter.add(DONE)
    await emitter.flush()


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
    count, early = _early_end(job.faults, len(pieces))
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
        async with engine.slot(job.prompt, len(pieces), bounded=False) as kv:
            cached = kv.cached_tokens
            metrics.prompt_tokens += job.prompt_tokens
            try:
                await _emit(request, emitter, state, job, count, kv.prefill_tokens)
            finally:
                natural_end = emitter.sent == len(pieces) and finish_reason == "stop"
                kv.generated = _computed(pieces[: emitter.sent], natural_end)
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
    metrics.success[finish_reason] += 1
    _log(state, job, True, 200, **usage, finish_reason=finish_reason, fault=fault)
    if finish_reason != "abort":
        with contextlib.suppress(ConnectionResetError):  # the client left after [DONE]
            await response.write_eof()
    return response
