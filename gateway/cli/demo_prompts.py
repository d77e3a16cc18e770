"""The demo's traffic: real prompts of every kind, from the three example tenants."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["DEMO_TRAFFIC", "DemoRequest"]


class DemoRequest(NamedTuple):
    tenant: str
    prompt: str
    stream: bool


_SIMPLE = (
    "What is the capital of Australia?",
    "Write a friendly two-line reminder that the team lunch moved to Friday.",
    "Translate 'good morning, see you tomorrow' into Spanish.",
    "Give me three name ideas for a golden retriever puppy.",
    "Summarize in one sentence: the meeting covered the Q3 budget and the new office.",
    "Fix the grammar: 'me and him goes to the store yesterday'.",
)
_HARD = (
    "Prove that there are infinitely many primes p such that p ≡ 3 (mod 4). Give a complete, "
    "rigorous argument and explain why the same idea fails for primes ≡ 1 (mod 4).",
    "Review this Python code for race conditions and fix them:\n```python\nimport threading\n"
    "balance = 0\ndef deposit(n):\n    global balance\n    for _ in range(n):\n"
    "        tmp = balance\n        balance = tmp + 1\nthreads = [threading.Thread(target=deposit, "
    "args=(10000,)) for _ in range(8)]\n```\nExplain the memory-model issue and give a lock-free "
    "alternative.",
    "A train leaves at 09:40 at 72 km/h; a second leaves the same station at 10:05 at 90 km/h on a "
    "parallel track. When and where does the second overtake the first? Then generalise to n "
    "trains with speeds v_i and departure delays d_i, and derive the overtaking order.",
    "Write a detailed analysis of the trade-offs between eventual and strong consistency for a "
    "multi-region payments ledger: failure modes during network partitions, reconciliation, "
    "idempotency keys, and how you would test the design. Conclude with a recommendation.",
    "Design a SQL schema and the queries for a double-entry bookkeeping system that supports "
    "multi-currency accounts, exchange-rate snapshots and month-end close; explain the indexes.",
    "Implement a lock-free single-producer single-consumer ring buffer in C++ with "
    "std::atomic, and argue its correctness under the C++ memory model (acquire/release).",
)

_TENANTS = ("acme", "globex", "initech")

DEMO_TRAFFIC: tuple[DemoRequest, ...] = tuple(
    DemoRequest(_TENANTS[i % 3], prompt, stream=i % 3 == 1)
    for i, prompt in enumerate(_SIMPLE + _HARD)
)
