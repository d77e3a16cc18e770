"""The KV cache in blocks, with vLLM's automatic prefix caching (``--enable-prefix-caching``).

The cache holds ``num_blocks`` blocks of ``block_size`` tokens. A running request holds blocks
for its prompt and its output budget (reserved when it gets its slot, as the engine always did).
With caching on, every *full* block of tokens is known by a chain hash: BLAKE2b of the previous
block's hash and the block's tokens, so a block's hash names the whole prefix up to and
including it (vLLM's ``hash_block_tokens``). What that means for a request:

* **Hits**: the longest run of leading prompt blocks whose hashes are cached. They are shared,
  not computed again: prefill covers only the rest. At most ``prompt - 1`` tokens can hit (the
  last prompt token is always computed, for its logits), so a prompt that is all cached and a
  whole number of blocks recomputes its last block. A partial block never hits.
* **Caching**: a request's full prompt blocks are cached when it gets its slot (a request
  arriving meanwhile can hit them); when it ends, so are the full blocks of what it generated
  (the prompt and the tokens whose KV was computed, which the caller says), so a conversation's
  next turn, which repeats the answer, hits them too.
* **Eviction**: a cached block no request holds stays cached but may be reused: a request
  needing blocks takes free ones first, then evicts the least recently freed cached blocks.
  A request's blocks are freed tail first, so a prefix outlives its continuations (vLLM frees
  blocks in reverse order for the same reason).
* **Usage** (``vllm:kv_cache_usage_perc``) is blocks held by running requests (a shared block
  once) over ``num_blocks``; cached blocks no request holds do not count, as in vLLM.
* **Stats** (``vllm:prefix_cache_queries`` / ``_hits``, in tokens): a request adds its prompt
  tokens to ``queries`` and its hit tokens to ``hits`` when it gets its slot; nothing is counted
  with caching off.

Not modelled: preemption and admission by KV room. A request that does not fit still runs (usage
reads 1 and every unheld cached block is evicted).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import orjson

__all__ = ["Allocation", "PrefixCache", "chain_hashes"]


def chain_hashes(
    tokens: Sequence[str], block_size: int, known: Sequence[bytes] = ()
) -> list[bytes]:
    """The chain hash of every full block of ``tokens``; ``known``: the hashes of its first
    blocks, already computed (they are kept, not recomputed)."""
    hashes = list(known)
    parent = hashes[-1] if hashes else b""
    for start in range(len(hashes) * block_size, len(tokens) - block_size + 1, block_size):
        block = orjson.dumps(list(tokens[start : start + block_size]))
        parent = hashlib.blake2b(parent + block, digest_size=16).digest()
        hashes.append(parent)
    return hashes


@dataclass(slots=True)
class Allocation:
    """The blocks one running request holds."""

    prompt: Sequence[str]
    hashes: list[bytes]
    """Chain hashes of the prompt's full blocks (empty with caching off)."""
    cached_tokens: int
    """Prompt tokens found in the cache: no prefill for them."""
    shared: list[bytes] = field(default_factory=list)
    """Hashed blocks held, in token order."""
    private: int = 0
    """Blocks held without a hash (partial, duplicate, or not yet written)."""
    generated: Sequence[str] = ()
    """Tokens after the prompt whose KV was computed; set by the caller before the end."""

    @property
    def prefill_tokens(self) -> int:
        return len(self.prompt) - self.cached_tokens


class PrefixCache:
    def __init__(self, num_blocks: int, block_size: int, *, enabled: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enabled = enabled
        self.queries = 0
        """Prompt tokens looked up (``vllm:prefix_cache_queries``)."""
        self.hits = 0
        """Prompt tokens found cached (``vllm:prefix_cache_hits``)."""
        self._held: dict[bytes, int] = {}
        """Cached blocks some running request holds, with how many hold each."""
        self._free: OrderedDict[bytes, None] = OrderedDict()
        """Cached blocks nobody holds, least recently freed first (the eviction order)."""
        self._private = 0

    @property
    def used_blocks(self) -> int:
        return len(self._held) + self._private

    @property
    def cached_blocks(self) -> int:
        """Blocks with a hash, held or not."""
        return len(self._held) + len(self._free)

    @property
    def usage(self) -> float:
        return min(1.0, self.used_blocks / self.num_blocks)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self._held or block_hash in self._free

    def allocate(self, prompt: Sequence[str], reserve_tokens: int) -> Allocation:
        """Blocks for a request with ``prompt`` and room for ``reserve_tokens`` in all (prompt
        included): its cached prefix shared, the rest new."""
        if not self.enabled:
            alloc = Allocation(prompt, [], 0)
            alloc.private = self._blocks_for(reserve_tokens)
            self._take(alloc.private)
            self._private += alloc.private
            return alloc
        hashes = chain_hashes(prompt, self.block_size)
        hit = 0
        for block_hash in hashes[: max(0, len(prompt) - 1) // self.block_size]:
            if block_hash not in self:
                break
            hit += 1
        alloc = Allocation(prompt, hashes, hit * self.block_size)
        self.queries += len(prompt)
        self.hits += alloc.cached_tokens
        for block_hash in hashes[:hit]:
            self._hold(alloc, block_hash)
        new = max(0, self._blocks_for(reserve_tokens) - hit)
        self._take(new)
        self._private += new
        alloc.private = new
        for block_hash in hashes[hit:]:
            self._cache(alloc, block_hash)
        return alloc

    def free(self, alloc: Allocation) -> None:
        """The request ended: cache the full blocks of what it generated, release its blocks."""
        if self.enabled and alloc.generated:
            tokens = [*alloc.prompt, *alloc.generated]
            for block_hash in chain_hashes(tokens, self.block_size, alloc.hashes)[
                len(alloc.hashes) :
            ]:
                self._cache(alloc, block_hash)
        for block_hash in reversed(alloc.shared):  # tail first: a prefix is evicted last
            held = self._held[block_hash] - 1
            if held:
                self._held[block_hash] = held
            else:
                del self._held[block_hash]
                self._free[block_hash] = None
        self._private -= alloc.private
        alloc.shared, alloc.private = [], 0
        self._take(0)  # after an overflow: no more blocks than the cache has

    # -- internals --------------------------------------------------------------------------

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _hold(self, alloc: Allocation, block_hash: bytes) -> None:
        if block_hash in self._free:
            del self._free[block_hash]
            self._held[block_hash] = 1
        else:
            self._held[block_hash] += 1
        alloc.shared.append(block_hash)

    def _cache(self, alloc: Allocation, block_hash: bytes) -> None:
        """Give one of ``alloc``'s private blocks the hash ``block_hash``: its tokens are
        written. A hash already cached (the same prefix computed twice) stays private."""
        if alloc.private == 0 or block_hash in self:
            return
        alloc.private -= 1
        self._private -= 1
        self._held[block_hash] = 1
        alloc.shared.append(block_hash)

    def _take(self, blocks: int) -> None:
        """Make room for ``blocks`` new blocks, evicting least recently freed cached ones (as
        many as there are, if the held blocks leave too little room)."""
        spare = self.num_blocks - self.used_blocks - len(self._free)
        while spare < blocks and self._free:
            self._free.popitem(last=False)
            spare += 1
