"""The prefix cache's block logic, without HTTP: chain hashes, hits, partial blocks, caching of
generated tokens, eviction order, usage and stats."""

from __future__ import annotations

import pytest

from backends.sim.prefix_cache import PrefixCache, chain_hashes
from backends.sim.request import Message
from backends.sim.tokens import chat_tokens, prompt_tokens, tokenize

BS = 4  # small blocks keep the arithmetic visible


def toks(tag: str, n: int) -> list[str]:
    return [f"{tag}{i}" for i in range(n)]


def test_chain_hash_names_the_whole_prefix_and_only_full_blocks() -> None:
    a = chain_hashes(toks("a", 10), BS)
    assert len(a) == 2  # 10 tokens: two full blocks, the last 2 tokens are no block
    assert chain_hashes(toks("a", 10), BS) == a  # deterministic
    changed = toks("a", 10)
    changed[5] = "x"  # inside block 1
    b = chain_hashes(changed, BS)
    assert b[0] == a[0] and b[1] != a[1]
    # The same block tokens after a different prefix hash differently.
    other = ["z", "z", "z", "z", *toks("a", 10)[4:8]]
    assert chain_hashes(other, BS)[1] != a[1]
    # Extending known hashes gives the same as hashing everything.
    longer = toks("a", 17)
    assert chain_hashes(longer, BS, a) == chain_hashes(longer, BS)
    # Token boundaries matter: ["ab", "c"] is not ["a", "bc"].
    assert chain_hashes(["ab", "c", "d", "e"], BS) != chain_hashes(["a", "bc", "d", "e"], BS)


@pytest.mark.parametrize(
    ("prompt", "hit"),
    [
        (3, 0),  # under one block: nothing to cache
        (4, 0),  # one full block, but the last token is always computed
        (5, 4),
        (8, 4),  # all cached and block-aligned: the last block is recomputed
        (9, 8),
        (11, 8),  # the partial tail block never hits
    ],
)
def test_a_repeated_prompt_hits_its_full_blocks_but_never_its_last_token(
    prompt: int, hit: int
) -> None:
    cache = PrefixCache(100, BS)
    first = cache.allocate(toks("p", prompt), prompt + 2)
    assert first.cached_tokens == 0 and first.prefill_tokens == prompt
    cache.free(first)
    again = cache.allocate(toks("p", prompt), prompt + 2)
    assert (again.cached_tokens, again.prefill_tokens) == (hit, prompt - hit)
    assert (cache.queries, cache.hits) == (2 * prompt, hit)


def test_hits_stop_at_the_first_block_that_differs() -> None:
    cache = PrefixCache(100, BS)
    cache.free(cache.allocate(toks("p", 13), 13))
    other = toks("p", 13)
    other[6] = "changed"  # block 1 differs: 1 and 2 miss (block 2's tokens match, its prefix not)
    assert cache.allocate(other, 13).cached_tokens == 4


def test_a_concurrent_request_hits_the_prompt_blocks_of_a_running_one() -> None:
    cache = PrefixCache(100, BS)
    running = cache.allocate(toks("p", 9), 12)  # 3 blocks held
    assert cache.used_blocks == 3 and cache.cached_blocks == 2
    second = cache.allocate(toks("p", 9), 12)
    assert second.cached_tokens == 8
    # Shared blocks count once: 2 shared + 1 private each.
    assert cache.used_blocks == 4
    cache.free(running)
    cache.free(second)
    assert cache.used_blocks == 0 and cache.usage == 0.0 and cache.cached_blocks == 2


def test_generated_tokens_are_cached_so_the_next_turn_hits_into_the_answer() -> None:
    cache = PrefixCache(100, BS)
    turn1 = cache.allocate(toks("p", 6), 6 + 8)
    turn1.generated = toks("g", 7)  # 13 tokens computed: 3 full blocks
    cache.free(turn1)
    assert cache.cached_blocks == 3
    turn2 = [*toks("p", 6), *toks("g", 7), *toks("u", 5)]
    assert cache.allocate(turn2, len(turn2) + 4).cached_tokens == 12


def test_turn_prompts_extend_each_other_token_for_token() -> None:
    system = Message("system", "You are terse.")
    user1 = Message("user", "What is a KV cache? Explain it in one sentence.")
    answer = " It keeps attention keys, and values, for reuse."
    turn1 = chat_tokens([system, user1])
    turn2 = chat_tokens([system, user1, Message("assistant", answer), Message("user", "Why?")])
    computed = [*turn1, *tokenize(answer)]
    assert turn2[: len(computed)] == computed
    for messages, cont in (([system, user1], False), ([user1, Message("assistant", "It")], True)):
        assert len(chat_tokens(messages, continue_final=cont)) == prompt_tokens(
            messages, continue_final=cont
        )


def test_eviction_takes_the_least_recently_freed_blocks_and_the_tail_first() -> None:
    cache = PrefixCache(6, BS)
    a = cache.allocate(toks("a", 9), 9)  # 3 blocks, 2 of them full (hashed)
    a_hashes = list(a.hashes)
    cache.free(a)
    b = cache.allocate(toks("b", 9), 9)
    b_hashes = list(b.hashes)
    cache.free(b)
    assert cache.cached_blocks == 4  # a0 a1 b0 b1, freed in that age order: a1 a0 b1 b0
    c = cache.allocate(toks("c", 12), 12)  # 3 new blocks; 2 empty ones left, 1 eviction
    assert a_hashes[1] not in cache  # a's tail went first ...
    assert a_hashes[0] in cache and all(h in cache for h in b_hashes)  # ... its head stays
    c_hashes = list(c.hashes)
    cache.free(c)  # the cache is full of unheld blocks, oldest first: a0 b1 b0 c2 c1 c0
    # A hit on a0 holds it (its second block evicts b1), and when freed it is the newest.
    touch = cache.allocate(toks("a", 5), 5)
    assert touch.cached_tokens == 4 and b_hashes[1] not in cache
    cache.free(touch)  # now: b0 c2 c1 c0 a0
    d = cache.allocate(toks("d", 16), 16)  # 4 new blocks, 1 empty: evicts b0 c2 c1
    assert {h for h in (*a_hashes, *b_hashes, *c_hashes, *d.hashes) if h in cache} == {
        a_hashes[0],
        c_hashes[0],
        *d.hashes,
    }


def test_blocks_held_by_running_requests_are_never_evicted() -> None:
    cache = PrefixCache(4, BS)
    held = cache.allocate(toks("h", 9), 9)  # 3 blocks
    big = cache.allocate(toks("x", 20), 20)  # 5 more: does not fit, runs anyway
    assert cache.usage == 1.0
    assert all(h in cache for h in held.hashes)
    cache.free(big)  # the cache keeps no more blocks than it has: 3 held + 1 of big's
    assert cache.cached_blocks == 3 and big.hashes[0] in cache
    cache.free(held)
    assert cache.usage == 0.0
    assert cache.allocate(toks("h", 9), 9).cached_tokens == 8


def test_with_caching_off_nothing_hits_nor_counts_but_blocks_are_used() -> None:
    cache = PrefixCache(100, BS, enabled=False)
    first = cache.allocate(toks("p", 9), 10)
    first.generated = toks("g", 1)
    cache.free(first)
    again = cache.allocate(toks("p", 9), 10)
    assert again.cached_tokens == 0 and again.prefill_tokens == 9
    assert cache.used_blocks == 3 and cache.usage == 0.03
    assert (cache.queries, cache.hits, cache.cached_blocks) == (0, 0, 0)
