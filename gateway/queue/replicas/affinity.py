"""Conversation affinity: a conversation's turns go to the same replica while it has room, so
vLLM's prefix cache already holds their shared prefix.

Each conversation has a *home* replica among its deployment's replicas, by rendezvous hashing
(highest random weight) of the conversation key with each replica's name: every gateway process
computes the same home without talking to the others, and adding or removing a replica moves
only the conversations whose home it was. The home goes first among the replicas a request may
use, if it is one of them (a stale or draining replica is not); whether it has room is then
decided as for any replica (a free slot lease).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the pool uses this module
    from gateway.queue.replicas.pool import Replica

__all__ = ["home_first", "home_of"]


def _weight(key: str, replica: str) -> int:
    digest = hashlib.blake2b(f"{key}\x00{replica}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def home_of(key: str, replicas: Sequence[Replica]) -> Replica | None:
    """The conversation's home among every replica of its deployment."""
    if not replicas:
        return None
    return max(replicas, key=lambda r: _weight(key, r.backend.name))


def home_first(
    ranked: Sequence[Replica], every: Sequence[Replica], key: str | None
) -> list[Replica]:
    """``ranked`` (best first) with the home of conversation ``key`` moved to the front, if it
    is among them; ``every``: all the deployment's replicas (the home is chosen among them all,
    so it does not move when another replica goes stale)."""
    if key is None or len(every) < 2:
        return list(ranked)
    home = home_of(key, every)
    if home is None or home not in ranked:
        return list(ranked)
    return [home, *(r for r in ranked if r is not home)]
