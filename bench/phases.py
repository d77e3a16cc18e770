"""The overhead bench's phases, each a series of points (``bench.points``) over the same targets:
the simulator directly and one or more gateways in front of it, every point measuring them all
in alternating blocks. Each phase returns its points by gateway name, every point of the shape
``json_point`` / ``stream_point`` give (direct against that gateway).

- ``closed_loop``: one point per concurrency (``args.concurrency``);
- ``open_loop``: rising fixed rates (``args.rates``); a gateway's ramp ends after the first rate
  it cannot serve, the others go on;
- ``streaming``: one point per number of concurrent streams (``args.stream_concurrency``).

``args`` are the bench's options (``bench.overhead.add_load_args``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import aiohttp

from bench.loadgen import Block, StreamBlock, Target, closed_block, open_block, stream_block
from bench.points import Gateway, json_point, measure_point, stream_point

__all__ = ["Prompts", "closed_loop", "open_loop", "streaming"]

Prompts = list[list[dict[str, str]]]
Points = dict[str, list[dict[str, Any]]]


def _label(label: str, gateway: str, gateways: Sequence[Gateway]) -> str:
    return label if len(gateways) == 1 else f"{label} {gateway}"


def _errors(point: dict[str, Any]) -> dict[str, int]:
    direct, through = point["direct"]["errors"], point["through"]["errors"]
    return {**{f"direct {k}": v for k, v in direct.items()}, **through}


def _print_json_point(label: str, point: dict[str, Any]) -> None:
    added, d, t = point["added_latency_ms"], point["direct"], point["through"]
    errors = _errors(point)
    print(
        f"{label:>10}  direct p50 {d['latency_ms']['p50']} p99 {d['latency_ms']['p99']} ms | "
        f"through p50 {t['latency_ms']['p50']} p99 {t['latency_ms']['p99']} ms | "
        f"added p50 {added['p50']} p99 {added['p99']} ms | "
        f"cpu {point.get('gateway_cpu_ms_per_request')} ms/req | "
        f"{t['throughput_rps']} rps" + (f" | ERRORS {errors}" if errors else ""),
        flush=True,
    )


async def closed_loop(
    args: argparse.Namespace, direct: Target, gateways: Sequence[Gateway], prompts: Prompts
) -> Points:
    points: Points = {g.name: [] for g in gateways}
    for c in args.concurrency:

        async def run(s: aiohttp.ClientSession, t: Target, d: float, c: int = c) -> Block:
            return await closed_block(s, t, prompts, concurrency=c, duration_s=d)

        measured, metrics = await measure_point(
            direct, gateways, c, run, warmup_s=args.warmup_s, point_s=args.point_s,
            block_s=args.block_s,
        )  # fmt: skip
        for g in gateways:
            point = {"concurrency": c, **json_point(measured, g.name), "metrics": metrics[g.name]}
            _print_json_point(_label(f"c={c}", g.name, gateways), point)
            points[g.name].append(point)
    return points


def _fell_over(point: dict[str, Any], rate: float) -> bool:
    through = point["through"]
    failed = sum(through["errors"].values())
    p99 = through["latency_ms"]["p99"]
    return (
        failed > 0.01 * max(through["sent"], 1)
        or (through["achieved_rps"] or 0) < 0.9 * rate
        or p99 is None
        or p99 > 1000
    )


def _rate_point(
    rate: float, point: dict[str, Any], metrics: dict[str, Any], budget_ms: float
) -> dict[str, Any]:
    point = {"rate_rps": rate, **point, "metrics": metrics}
    for side in (point["direct"], point["through"]):
        side["achieved_rps"] = side["throughput_rps"]  # ok / (first start .. last answer)
    added_p99 = point["added_latency_ms"]["p99"]
    point["sustained"] = (
        not point["through"]["errors"]
        and not point["direct"]["errors"]
        and point["through"]["achieved_rps"] >= 0.95 * rate
        and added_p99 is not None
        and added_p99 < budget_ms
    )
    point["fell_over"] = _fell_over(point, rate)
    return point


async def open_loop(
    args: argparse.Namespace, direct: Target, gateways: Sequence[Gateway], prompts: Prompts
) -> Points:
    """Rising fixed rates; a gateway's ramp stops after the first rate it cannot serve."""
    points: Points = {g.name: [] for g in gateways}
    ramping = list(gateways)
    for rate in args.rates:
        if not ramping:
            break

        async def run(s: aiohttp.ClientSession, t: Target, d: float, r: float = rate) -> Block:
            return await open_block(s, t, prompts, rate=r, duration_s=d)

        measured, metrics = await measure_point(
            direct, ramping, 0, run, warmup_s=min(args.warmup_s, 1.0), point_s=args.point_s,
            block_s=args.block_s,
        )  # fmt: skip
        for g in list(ramping):
            point = _rate_point(
                rate, json_point(measured, g.name), metrics[g.name], args.p99_budget_ms
            )
            _print_json_point(_label(f"{rate:g} rps", g.name, gateways), point)
            points[g.name].append(point)
            if point["fell_over"]:
                who = "the gateway" if len(gateways) == 1 else g.name
                print(f"    {who} fell over at {rate:g} rps: stopping its rate ramp", flush=True)
                ramping.remove(g)
    return points


async def streaming(
    args: argparse.Namespace, direct: Target, gateways: Sequence[Gateway], prompts: Prompts
) -> Points:
    points: Points = {g.name: [] for g in gateways}
    stream_s = args.itl_ms / 1000 * args.max_tokens  # one stream's length
    for c in args.stream_concurrency:

        async def run(s: aiohttp.ClientSession, t: Target, d: float, c: int = c) -> StreamBlock:
            spread = min(stream_s, d / 2)
            return await stream_block(s, t, prompts, concurrency=c, duration_s=d, spread_s=spread)

        point_s = max(args.stream_point_s, args.stream_min_streams * stream_s / c)
        measured, metrics = await measure_point(
            direct, gateways, c, run, warmup_s=0.01, point_s=point_s,
            block_s=args.stream_block_s,
        )  # fmt: skip
        for g in gateways:
            point = {
                "concurrency": c,
                **stream_point(measured, args.itl_ms / 1000, g.name),
                "metrics": metrics[g.name],
            }
            d, t, errors = point["direct"], point["through"], _errors(point)
            print(
                f"{_label(f'stream c={c}', g.name, gateways)}  ttft direct p50 "
                f"{d['ttft_ms']['p50']} through p50 {t['ttft_ms']['p50']} ms | added ttft p50 "
                f"{point['added_ttft_ms']['p50']} p99 {point['added_ttft_ms']['p99']} ms | "
                f"added gap through p99 {t['added_gap_ms']['p99']} max "
                f"{t['added_gap_ms']['max']} ms (direct p99 {d['added_gap_ms']['p99']} max "
                f"{d['added_gap_ms']['max']})" + (f" | ERRORS {errors}" if errors else ""),
                flush=True,
            )
            points[g.name].append(point)
    return points
