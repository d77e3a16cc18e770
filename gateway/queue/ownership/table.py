"""Job ownership: who answers and books a request, as one table.

A request's outcome has exactly one owner at a time, recorded in its claim key
(``RedisKeys.claim``, in the tier's slot beside the job streams and the tier heartbeats):

| state | claim key holds | meaning |
| --- | --- | --- |
| ``free`` | nothing | queued, not started; or handed back at shutdown (its calls noted) |
| ``running`` | the worker's id | that worker runs the job and will book and answer it |
| ``edge`` | ``edge`` | the edge answered (deadline, or its client left) and books the row |
| ``finished`` | ``done:<worker id>`` | a run booked its row, acknowledged, sent its answer |

``transition`` is the table of every step; each step is one Redis command or one Lua script
on the claim's slot, so two processes racing for a request are decided by Redis alone
(``OwnershipScripts``). docs/queue.md ("Job ownership") prints the same table;
``tests/gateway/queue/test_ownership.py`` walks every row against the scripts and checks that
the page matches ``table_markdown()``.

A job started at once (``Worker.start_now``) has no claim key while it runs: its stream entry
names its worker (``o``), which counts as the claim for a take-over (``started_by``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

__all__ = [
    "EDGE_CLAIM",
    "FINISHED_PREFIX",
    "RUNNING_GRACE_S",
    "TRANSITIONS",
    "ClaimState",
    "EdgeTakeOver",
    "OwnershipScripts",
    "Step",
    "TakeOver",
    "Transition",
    "Verdict",
    "state_of",
    "table_markdown",
    "transition",
]

EDGE_CLAIM = "edge"
"""The value of a claim the edge took (a worker's claim holds its worker id)."""

RUNNING_GRACE_S = 5.0
"""How long past its deadline the edge still waits for a job a worker has started: the worker's
backend timeouts end it at the deadline, so this only covers a worker that died mid-job (or is
late); the 504 the edge answers then is booked provisional (``RunTimedOut``)."""

FINISHED_PREFIX = "done:"
"""A finished job's claim: ``done:<worker id>``, set in the same script as its acknowledgement."""


class ClaimState(enum.StrEnum):
    FREE = "free"
    RUNNING = "running"
    EDGE = "edge"
    FINISHED = "finished"


class Step(enum.StrEnum):
    """Who does what to a claim."""

    WORKER_STARTS = "worker starts a taken job (SET NX)"
    HANDED_OVER = "enqueue hands the job to an idle worker (SET NX in the enqueue script)"
    EDGE_GIVES_UP = "edge: deadline passed, or its client left (SET NX)"
    TAKE_OVER = "reclaimer finds the entry idle (take-over script)"
    HAND_BACK = "worker hands the job back at shutdown (compare-and-delete script)"
    FINISH = "worker booked the row (finish script, behind the ledger event)"
    EDGE_TAKES_OVER = "edge: a started stream is silent and its worker's heartbeat gone (script)"


class Verdict(enum.StrEnum):
    """What the step's caller does next."""

    RUN = "run it"
    ANSWERED_BY_EDGE = "the edge answers and books it; a worker drops it"
    OWNED_BY_WORKER = "the edge waits: a worker answers it"
    ALREADY_FINISHED = "drop it: already booked and answered"
    OWNER_ALIVE = "leave it: its worker lives"
    OTHER_WORKER = "drop it: another worker runs it"
    RELEASED = "released"
    NOT_OURS = "nothing: the claim is not this worker's"
    FINISHED = "finished: acknowledged, the answer goes out"


class EdgeTakeOver(enum.StrEnum):
    """What the edge's take-over script answers."""

    TAKEN = "taken"
    """The worker was gone: the edge holds the claim now (no run will start)."""
    EDGE = "edge"
    ALIVE = "alive"
    FINISHED = "done"
    FREE = "free"
    """Handed back (its claim released): the edge's claim at the deadline decides."""


class TakeOver(enum.StrEnum):
    """What the take-over script answers."""

    RUN = "mine"
    EDGE = "edge"
    ALIVE = "alive"
    FINISHED = "done"


@dataclass(frozen=True, slots=True)
class Transition:
    step: Step
    before: ClaimState
    owner: str
    """Whose claim it was, for ``running``: ``self``, ``live`` (another, heartbeat there),
    ``dead`` (another, heartbeat gone); ``-`` for the other states."""
    after: ClaimState
    verdict: Verdict


def _rows() -> tuple[Transition, ...]:
    S, V = ClaimState, Verdict
    rows: list[Transition] = []
    rows += [
        Transition(Step.HANDED_OVER, S.FREE, "-", S.RUNNING, V.RUN),
        Transition(Step.WORKER_STARTS, S.FREE, "-", S.RUNNING, V.RUN),
        Transition(Step.WORKER_STARTS, S.RUNNING, "live", S.RUNNING, V.OTHER_WORKER),
        Transition(Step.WORKER_STARTS, S.EDGE, "-", S.EDGE, V.ANSWERED_BY_EDGE),
        Transition(Step.WORKER_STARTS, S.FINISHED, "-", S.FINISHED, V.ALREADY_FINISHED),
        Transition(Step.EDGE_GIVES_UP, S.FREE, "-", S.EDGE, V.ANSWERED_BY_EDGE),
        Transition(Step.EDGE_GIVES_UP, S.RUNNING, "live", S.RUNNING, V.OWNED_BY_WORKER),
        Transition(Step.EDGE_GIVES_UP, S.FINISHED, "-", S.FINISHED, V.OWNED_BY_WORKER),
        Transition(Step.TAKE_OVER, S.FREE, "-", S.RUNNING, V.RUN),
        Transition(Step.TAKE_OVER, S.RUNNING, "self", S.RUNNING, V.RUN),
        Transition(Step.TAKE_OVER, S.RUNNING, "live", S.RUNNING, V.OWNER_ALIVE),
        Transition(Step.TAKE_OVER, S.RUNNING, "dead", S.RUNNING, V.RUN),
        Transition(Step.TAKE_OVER, S.EDGE, "-", S.EDGE, V.ANSWERED_BY_EDGE),
        Transition(Step.TAKE_OVER, S.FINISHED, "-", S.FINISHED, V.ALREADY_FINISHED),
        Transition(Step.HAND_BACK, S.RUNNING, "self", S.FREE, V.RELEASED),
        Transition(Step.HAND_BACK, S.RUNNING, "live", S.RUNNING, V.NOT_OURS),
        Transition(Step.HAND_BACK, S.FREE, "-", S.FREE, V.NOT_OURS),
        Transition(Step.HAND_BACK, S.EDGE, "-", S.EDGE, V.NOT_OURS),
        Transition(Step.FINISH, S.RUNNING, "self", S.FINISHED, V.FINISHED),
        Transition(Step.FINISH, S.FREE, "-", S.FINISHED, V.FINISHED),
        Transition(Step.FINISH, S.RUNNING, "live", S.FINISHED, V.FINISHED),
        Transition(Step.EDGE_TAKES_OVER, S.RUNNING, "dead", S.EDGE, V.ANSWERED_BY_EDGE),
        Transition(Step.EDGE_TAKES_OVER, S.RUNNING, "live", S.RUNNING, V.OWNED_BY_WORKER),
        Transition(Step.EDGE_TAKES_OVER, S.FINISHED, "-", S.FINISHED, V.OWNED_BY_WORKER),
        Transition(Step.EDGE_TAKES_OVER, S.FREE, "-", S.FREE, V.OWNED_BY_WORKER),
        Transition(Step.EDGE_TAKES_OVER, S.EDGE, "-", S.EDGE, V.ANSWERED_BY_EDGE),
    ]
    return tuple(rows)


TRANSITIONS: tuple[Transition, ...] = _rows()
"""Every step from every state it can meet. ``finish`` from ``free`` is a job started at once
(no claim key); from another worker's ``running``, a worker presumed dead that finished first
(the take-over's run then finds ``finished`` only when it books: its row is the second for the
request id and the ledger keeps the first)."""


def transition(step: Step, before: ClaimState, owner: str = "-") -> Transition:
    """The row of ``TRANSITIONS`` for ``step`` from ``before`` (``owner`` as in the table)."""
    for row in TRANSITIONS:
        if row.step is step and row.before is before and row.owner == owner:
            return row
    raise ValueError(f"no transition for {step.name} from {before} ({owner})")


def state_of(raw: bytes | str | None) -> ClaimState:
    """The state a claim key's value stands for."""
    if raw is None:
        return ClaimState.FREE
    value = raw.decode() if isinstance(raw, bytes) else raw
    if value == EDGE_CLAIM:
        return ClaimState.EDGE
    if value.startswith(FINISHED_PREFIX):
        return ClaimState.FINISHED
    return ClaimState.RUNNING


def table_markdown() -> str:
    """The table as docs/queue.md prints it."""
    lines = [
        "| step | claim before | its worker | claim after | the caller |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in TRANSITIONS:
        lines.append(
            f"| {row.step.value} | {row.before.value} | {row.owner} | {row.after.value} "
            f"| {row.verdict.value} |"
        )
    return "\n".join(lines)


_HELD = """
-- Who holds a claim that may not be taken: the edge, a worker that finished the job, or a
-- worker whose heartbeat is alive; nil for a dead worker's claim (taken by the caller).
local function held(owner, edge, finished, heartbeats)
  if owner == edge then return 'edge' end
  if string.sub(owner, 1, string.len(finished)) == finished then return 'done' end
  if redis.call('EXISTS', heartbeats .. owner) == 1 then return 'alive' end
  return nil
end
"""

_TAKE_OVER = (
    _HELD
    + """
local owner = redis.call('GET', KEYS[1])
if not owner and ARGV[5] ~= '' then owner = ARGV[5] end
if owner == ARGV[1] then return 'mine' end
if owner then
  local holder = held(owner, ARGV[3], ARGV[6], ARGV[4])
  if holder then return holder end
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return 'mine'
"""
)

_EDGE_TAKE_OVER = (
    _HELD
    + """
local owner = redis.call('GET', KEYS[1])
if not owner then return 'free' end
local holder = held(owner, ARGV[1], ARGV[3], ARGV[2])
if holder then return holder end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[4])
return 'taken'
"""
)

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""

_FINISH = """
redis.call('XACK', KEYS[2], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[2], ARGV[2])
local before = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], ARGV[3], 'EX', ARGV[4])
return before
"""


class OwnershipScripts:
    """The Lua steps of the table (the ``SET NX`` steps are plain commands)."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._take_over = redis.register_script(_TAKE_OVER)
        self._release = redis.register_script(_RELEASE)
        self._finish = redis.register_script(_FINISH)
        self._edge_take_over = redis.register_script(_EDGE_TAKE_OVER)

    async def edge_take_over(
        self, claim: str, *, heartbeat_prefix: str, ttl_s: int, pipe: Pipeline | None = None
    ) -> EdgeTakeOver | None:
        """The edge takes the claim of a job whose worker's heartbeat is gone. Queued on
        ``pipe`` when given (``None`` returned: its reply is the pipeline's)."""
        args: list[str | int] = [EDGE_CLAIM, heartbeat_prefix, FINISHED_PREFIX, ttl_s]
        if pipe is not None:
            pipe.scripts.add(cast(Any, self._edge_take_over))
            pipe.evalsha(self._edge_take_over.sha, 1, claim, *args)
            return None
        result: Any = await self._edge_take_over(keys=[claim], args=args)
        return EdgeTakeOver(result.decode() if isinstance(result, bytes) else str(result))

    async def take_over(
        self,
        claim: str,
        *,
        worker_id: str,
        ttl_s: int,
        heartbeat_prefix: str,
        started_by: str = "",
    ) -> TakeOver:
        result: Any = await self._take_over(
            keys=[claim],
            args=[worker_id, ttl_s, EDGE_CLAIM, heartbeat_prefix, started_by, FINISHED_PREFIX],
        )
        return TakeOver(result.decode() if isinstance(result, bytes) else str(result))

    async def release(self, claim: str, worker_id: str) -> bool:
        """Compare-and-delete: give the claim up only while it is ``worker_id``'s."""
        return bool(await self._release(keys=[claim], args=[worker_id]))

    def finish(
        self,
        pipe: Pipeline,
        claim: str,
        *,
        stream: str,
        group: str,
        entry_id: bytes,
        worker_id: str,
        ttl_s: int,
    ) -> None:
        """Queue on ``pipe`` (behind the ledger event) the script that acknowledges and deletes
        the job's entry and marks its claim finished."""
        pipe.scripts.add(cast(Any, self._finish))  # an async script: loaded at execute
        pipe.evalsha(
            self._finish.sha, 2, claim, stream, group, entry_id, FINISHED_PREFIX + worker_id, ttl_s
        )
