"""vLLM liveness: the server answers /health, and an engine with work makes progress.

vLLM's ``/health`` fails when its engine process has died, but an engine that hangs (a stuck
NCCL collective, a wedged CUDA kernel) keeps answering it while every request waits forever.
This probe (an exec liveness probe in the vLLM pods, stdlib only) also reads ``/metrics``: while
requests are running, the prompt and generation token counters must move; if they stay still
for ``--stall-s`` with requests running, the probe fails and the kubelet restarts the pod. An
idle engine (nothing running) is never stuck. The last progress seen is kept in a state file
between runs (``--state``, in the container's writable /tmp).

Exit 0: alive. Exit 1: /health not 200, /metrics unreadable, or stalled with work.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path

RUNNING = ("vllm:num_requests_running",)
PROGRESS = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total")


def _sum(text: str, names: tuple[str, ...]) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(names) and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in names:
                total += float(line.rsplit(" ", 1)[1])
    return total


def verdict(text: str, state: dict[str, float], now: float, stall_s: float) -> tuple[bool, dict]:
    """Alive or not, and the state to keep, from one /metrics page and the last state."""
    running = _sum(text, RUNNING)
    progress = _sum(text, PROGRESS)
    if running <= 0 or progress != state.get("progress") or "at" not in state:
        return True, {"progress": progress, "at": now}
    return now - state["at"] <= stall_s, state


def _get(url: str, timeout_s: float) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (loopback)
        return resp.status, resp.read().decode("utf-8", "replace")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--stall-s", type=float, default=120.0)
    parser.add_argument("--timeout-s", type=float, default=4.0)
    # the vLLM container's own /tmp (one writer: this probe, never run twice at once)
    parser.add_argument("--state", default="/tmp/engine-progress.json")  # noqa: S108
    args = parser.parse_args(argv)
    try:
        status, _ = _get(f"{args.url}/health", args.timeout_s)
        if status != 200:
            return 1
        _, text = _get(f"{args.url}/metrics", args.timeout_s)
    except (OSError, ValueError):
        return 1
    path = Path(args.state)
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        state = {}
    alive, keep = verdict(text, state, time.time(), args.stall_s)
    path.write_text(json.dumps(keep))
    if not alive:  # the kubelet records a probe's output in the pod's events
        sys.stdout.write(f"engine stalled: requests running, no token for {args.stall_s:.0f} s\n")
    return 0 if alive else 1


if __name__ == "__main__":
    sys.exit(main())
