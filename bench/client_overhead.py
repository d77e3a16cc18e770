"""CPU cost per call of the HTTP clients tiergate could use for vLLM, and of ``VLLMBackend``.

A local aiohttp server (its own process, so its CPU is not counted) answers a fixed
chat-completion JSON instantly, or a fixed SSE stream of ``--chunks`` chunks. The client process
sends small POSTs (orjson-encoded body, orjson-decoded answer, like the adapter) and measures its
own CPU time (``time.process_time``) per request, at concurrency 1 and 16, on uvloop (what
uvicorn runs) and on the default asyncio loop. Each figure is the median of ``--repeats`` runs
of ``--requests`` requests after a warm-up.

    .venv/bin/python bench/client_overhead.py            # writes bench/results/client_overhead.json
    .venv/bin/python bench/client_overhead.py --requests 300 --repeats 1 --out /tmp/quick.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib.metadata
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backends.openai_http import VLLMBackend
from backends.types import ChatRequest
from bench.machine import cpu_model

RESULTS = Path(__file__).resolve().parent / "results" / "client_overhead.json"
BODY = {
    "model": "llama-3.1-8b-instruct",
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France? Answer in one word."},
    ],
    "max_tokens": 16,
    "temperature": 0,
}
ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "llama-3.1-8b-instruct",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Paris."},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 31, "completion_tokens": 3, "total_tokens": 34},
    }
)

Call = Callable[[], Awaitable[Any]]


# --- server (child process) ---------------------------------------------------------------


def _sse_events(chunks: int) -> list[bytes]:
    def event(delta: dict[str, Any], finish: str | None, usage: Any = None) -> bytes:
        data = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": "llama-3.1-8b-instruct",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if delta else [],
            "usage": usage,
        }
        return b"data: " + orjson.dumps(data) + b"\n\n"

    events = [event({"role": "assistant", "content": ""}, None)]
    events += [event({"content": f" tok{i}"}, None) for i in range(chunks)]
    events.append(event({"content": ""}, "stop"))
    usage = {"prompt_tokens": 31, "completion_tokens": chunks, "total_tokens": 31 + chunks}
    events.append(event({}, None, usage))
    events.append(b"data: [DONE]\n\n")
    return events


def serve(port: int, chunks: int) -> None:
    events = _sse_events(chunks)

    async def completions(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        if not body.get("stream"):
            return web.Response(body=ANSWER, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event in events:
            await resp.write(event)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


# --- clients ------------------------------------------------------------------------------


def _payload() -> bytes:
    return orjson.dumps(BODY)


async def _measure(call: Call, *, requests: int, concurrency: int, warmup: int) -> dict[str, float]:
    async def worker(n: int) -> None:
        for _ in range(n):
            await call()

    await asyncio.gather(*(worker(warmup // concurrency or 1) for _ in range(concurrency)))
    per_worker = requests // concurrency
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker(per_worker) for _ in range(concurrency)))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    n = per_worker * concurrency
    return {"cpu_ms": 1000 * cpu / n, "wall_ms": 1000 * wall / n}


async def run_aiohttp(url: str, **kw: Any) -> dict[str, float]:
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:

        async def call() -> Any:
            async with session.post(url, data=_payload(), headers=headers) as resp:
                return orjson.loads(await resp.read())

        return await _measure(call, **kw)


async def run_httpx(module_name: str, url: str, **kw: Any) -> dict[str, float]:
    httpx: Any = __import__(module_name)
    headers = {"Content-Type": "application/json"}
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:

        async def call() -> Any:
            resp = await client.post(url, content=_payload(), headers=headers)
            return orjson.loads(resp.content)

        return await _measure(call, **kw)


async def run_backend(base_url: str, *, stream: bool, **kw: Any) -> dict[str, float]:
    backend = VLLMBackend.create("bench", base_url, max_connections=64)
    request = ChatRequest(model="llama-3.1-8b-instruct", body=BODY, request_id="bench")
    try:
        if stream:

            async def call() -> Any:
                return [chunk async for chunk in backend.stream(request)]
        else:

            async def call() -> Any:
                return await backend.chat(request)

        return await _measure(call, **kw)
    finally:
        await backend.aclose()


def _clients(base_url: str) -> dict[str, Callable[..., Coroutine[Any, Any, dict[str, float]]]]:
    url = base_url + "/v1/chat/completions"
    clients: dict[str, Callable[..., Coroutine[Any, Any, dict[str, float]]]] = {
        "aiohttp": lambda **kw: run_aiohttp(url, **kw),
        "httpx": lambda **kw: run_httpx("httpx", url, **kw),
    }
    try:
        __import__("httpx2")  # the openai SDK's transport in recent releases
        clients["httpx2"] = lambda **kw: run_httpx("httpx2", url, **kw)
    except ImportError:
        pass
    clients["VLLMBackend.chat"] = lambda **kw: run_backend(base_url, stream=False, **kw)
    clients["VLLMBackend.stream"] = lambda **kw: run_backend(base_url, stream=True, **kw)
    return clients


def _run_one(
    loop_name: str, factory: Callable[[], Coroutine[Any, Any, dict[str, float]]]
) -> dict[str, float]:
    if loop_name == "uvloop":
        import uvloop

        return uvloop.run(factory())
    return asyncio.run(factory())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"bench server did not start on port {port}")


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("aiohttp", "httpx", "httpx2", "orjson", "uvloop"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[dist] = importlib.metadata.version(dist)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1600)
    parser.add_argument("--warmup", type=int, default=160)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chunks", type=int, default=32, help="content chunks per stream")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--loops", nargs="+", default=["uvloop", "asyncio"])
    parser.add_argument("--clients", nargs="*", help="subset of client names")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.chunks)
        return

    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), "--chunks", str(args.chunks)]
    )
    results: list[dict[str, Any]] = []
    try:
        _wait_for(port)
        base_url = f"http://127.0.0.1:{port}"
        clients = _clients(base_url)
        names = args.clients or list(clients)
        for loop_name in args.loops:
            for concurrency in args.concurrency:
                for name in names:
                    kw = {"requests": args.requests, "concurrency": concurrency}
                    kw["warmup"] = args.warmup
                    runs = [
                        _run_one(loop_name, functools.partial(clients[name], **kw))
                        for _ in range(args.repeats)
                    ]
                    row = {
                        "client": name,
                        "loop": loop_name,
                        "concurrency": concurrency,
                        "cpu_ms_per_call": round(statistics.median(r["cpu_ms"] for r in runs), 4),
                        "cpu_ms_min": round(min(r["cpu_ms"] for r in runs), 4),
                        "wall_ms_per_call": round(statistics.median(r["wall_ms"] for r in runs), 4),
                    }
                    results.append(row)
                    print(
                        f"{loop_name:8} c={concurrency:<3} {name:20} "
                        f"cpu {row['cpu_ms_per_call']:.3f} ms/call "
                        f"(min {row['cpu_ms_min']:.3f})  wall {row['wall_ms_per_call']:.3f} ms"
                    )
    finally:
        server.terminate()
        server.wait(timeout=10)

    report = {
        "what": "client-process CPU time (time.process_time) per call against a local aiohttp "
        "server in another process answering instantly; median of repeats",
        "call": f"POST /v1/chat/completions, {len(_payload())}-byte orjson body, "
        f"{len(ANSWER)}-byte JSON answer; "
        f"VLLMBackend.stream is one streamed call of {args.chunks} content chunks "
        "(+ role, finish and usage chunks, [DONE])",
        "note": "2 shared cores with other work running: expect +-20% between runs; "
        "compare clients within one run",
        "requests_per_run": args.requests,
        "repeats": args.repeats,
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform()},
        "versions": _versions(),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
