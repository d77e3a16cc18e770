"""The engine model: continuous-batching capacity, a FIFO waiting queue and the latency model.

At most ``max_num_seqs`` requests hold a slot (``running``); the rest wait in arrival order
(``waiting``), like vLLM's scheduler, and a freed slot goes straight to the oldest waiter. With
``max_num_queued`` set, a request that would wait behind that many others is refused with 503
(vLLM's ``--max-num-queued-reqs``).

Latency (profile values, in seconds of simulated time; multiply by ``time_scale`` for wall time):

* time to first token = ``(ttft_base_s + prefill_tokens x ttft_per_prompt_token_s) x slowdown``,
  where ``prefill_tokens`` are the prompt tokens not found in the prefix cache
* inter-token latency = ``itl_s x slowdown``

where ``slowdown = 1 + (load_slowdown - 1) x (running - 1) / (max_num_seqs - 1)``, read when the
latency is asked for (llm-d-inference-sim's time-factor-under-load). Waiting time is real: it is
whatever the requests ahead take.

KV: a request gets blocks for its prompt and completion when it gets its slot, from the engine's
``PrefixCache`` (``kv_cache_tokens / block_size`` blocks), which finds its cached prefix; KV usage
is the blocks running requests hold over all blocks (``backends.sim.prefix_cache``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from backends.sim.prefix_cache import Allocation, PrefixCache
from backends.sim.profiles import SimProfile

__all__ = ["QueueFull", "SimEngine"]


class QueueFull(Exception):
    """The waiting queue is at ``max_num_queued``."""


class SimEngine:
    def __init__(self, profile: SimProfile) -> None:
        self._profile = profile
        self._running = 0
        self.cache = PrefixCache(
            profile.kv_cache_tokens // profile.block_size,
            profile.block_size,
            enabled=profile.enable_prefix_caching,
        )
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def running(self) -> int:
        return self._running

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def kv_usage(self) -> float:
        """Fraction of the KV blocks held by running requests (0-1)."""
        return self.cache.usage

    def slowdown(self) -> float:
        p = self._profile
        if p.max_num_seqs == 1 or p.load_slowdown == 1.0:
            return 1.0
        busy = max(0, self._running - 1) / (p.max_num_seqs - 1)
        return 1.0 + (p.load_slowdown - 1.0) * busy

    def ttft_s(self, prefill_tokens: int) -> float:
        """Time to first token of a request whose prefill computes ``prefill_tokens`` (its
        prompt less what the prefix cache held)."""
        p = self._profile
        return (p.ttft_base_s + prefill_tokens * p.ttft_per_prompt_token_s) * self.slowdown()

    def itl_s(self) -> float:
        return self._profile.itl_s * self.slowdown()

    def check_admission(self) -> None:
        """Raise ``QueueFull`` if a request arriving now would be refused."""
        limit = self._profile.max_num_queued
        busy = self._running >= self._profile.max_num_seqs
        if limit is not None and busy and len(self._waiters) >= limit:
            raise QueueFull

    @asynccontextmanager
    async def slot(
        self, prompt: Sequence[str], completion_tokens: int, *, bounded: bool = True
    ) -> AsyncIterator[Allocation]:
        """Hold one running slot (waiting FIFO for it) with KV blocks for ``prompt`` (its tokens)
        and ``completion_tokens``; yields the allocation (its ``cached_tokens``; set its
        ``generated`` tokens to have them cached at the end).

        ``bounded=False`` skips the queue cap, for a caller that ran ``check_admission`` on
        arrival (a stream, which sends its headers before it waits, as vLLM does).
        """
        await self._acquire(bounded)
        alloc = self.cache.allocate(prompt, len(prompt) + completion_tokens)
        try:
            yield alloc
        finally:
            self.cache.free(alloc)
            self._hand_over()

    async def _acquire(self, bounded: bool) -> None:
        if self._running < self._profile.max_num_seqs and not self._waiters:
            self._running += 1
            return
        if bounded:
            self.check_admission()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._hand_over()  # the slot was already ours: pass it on
            elif waiter in self._waiters:  # (a hand-over may have dropped it already)
                self._waiters.remove(waiter)
            raise

    def _hand_over(self) -> None:
        """Give a freed slot to the oldest live waiter, or free it."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._running -= 1
