"""Idempotency keys: a repeated non-streamed request (same tenant, same ``idempotency-key``) runs
once; the repeat waits for the first one's answer and gets the same body.

``<p>:{idem:<tenant>}:k:<key>`` holds the request id of the first request and a fingerprint of
its body (``SET NX``; ``request_fingerprint``), and
``<p>:{idem:<tenant>}:r:<key>`` its final reply once its worker has one (apart, so that no
client key can name another key's reply); both expire after ``ttl_s``. The repeat is
never queued, so the backend is called once and the ledger has the first request's row only.
A repeat whose body differs from the first one's is not a repeat but a client error: it is
refused with 422 ``idempotency_key_mismatch`` (the IETF ``Idempotency-Key`` draft's answer),
runs nothing, and leaves the key to the first request.

After a Redis loss the keys are gone, so the ledger is asked instead: the row of a request that
ran carries its key (``ledger_entries.idempotency_key``). To keep SQL off the request path, the
tenant's marker ``<p>:{idem:<tenant>}`` (no key suffix, so no client key can name it) holds the
time since which this Redis has remembered the tenant's keys. A key missing while that time is
less than ``ttl_s`` ago may have been lost: the claim script then claims nothing and the ledger
is asked once for that key. A row found there (the tenant's own, within ``ttl_s``) means the
request ran; its answer went with Redis, so the repeat is refused with 409
``idempotency_key_reused`` naming the first request id, and the key is put back in Redis with a
marker in place of the answer, so later repeats are refused without SQL. No row: claimed as usual.
If SQL cannot answer then, the request is refused with 503 (never run twice for want of it).
A request that ran during the loss but was not yet in SQL when its repeat came is the gap.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import orjson
import redis.asyncio as aioredis
from sqlalchemy.exc import SQLAlchemyError

from gateway.errors import (
    DeadlineExceeded,
    IdempotencyKeyMismatch,
    IdempotencyKeyReused,
    ServiceUnavailable,
)
from gateway.queue.keys import RedisKeys
from gateway.reply_meta import ReplyMeta
from router.plan import RoutePlan

__all__ = [
    "Answer",
    "Fingerprinted",
    "FirstAnswer",
    "Idempotency",
    "IdempotencySource",
    "request_fingerprint",
]

_POLL_S = 0.02
LOOKUP_TIMEOUT_S = 2.0
"""How long the ledger may take to say whether a key was used, before the request gets 503."""
MARKER_TTL_S = 7 * 86_400
"""How long a tenant's marker outlives its last keyed request (then: as after a loss)."""

_CLAIM = """
local now = tonumber(redis.call('TIME')[1])
local ttl = tonumber(ARGV[2])
local lost = false
if ARGV[3] == '1' then
  local since = redis.call('GET', KEYS[2])
  if since then
    redis.call('EXPIRE', KEYS[2], tonumber(ARGV[4]))
    lost = now - tonumber(since) < ttl
  else
    redis.call('SET', KEYS[2], now, 'EX', tonumber(ARGV[4]))
    lost = true
  end
end
local first = redis.call('GET', KEYS[1])
if first then return {0, first} end
if lost then return {2, ''} end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ttl)
return {1, ''}
"""


_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class Fingerprinted(Protocol):
    """What makes a keyed request what it is (``gateway.queue.jobs.Job``)."""

    @property
    def plan(self) -> RoutePlan: ...
    @property
    def stream(self) -> bool: ...
    @property
    def body(self) -> dict[str, Any]: ...


class Answer(Protocol):
    """A final answer kept for a key's repeats (``gateway.queue.jobs.Reply``)."""

    @property
    def request_id(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def data(self) -> dict[str, Any]: ...
    @property
    def meta(self) -> ReplyMeta: ...


@dataclass(frozen=True, slots=True)
class FirstAnswer:
    """The first request's answer, as kept (an ``Answer``)."""

    request_id: str
    kind: str
    data: dict[str, Any]
    meta: ReplyMeta


def request_fingerprint(job: Fingerprinted) -> str:
    """What makes two requests with one key the same request: the model asked for, streaming
    or not, and the body the backend gets (every field the client sent but ``metadata``), in
    a canonical form (key order and spacing do not matter)."""
    canonical = orjson.dumps(
        [job.plan.requested_model, job.stream, job.body],
        option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS,
    )
    return hashlib.sha256(canonical).hexdigest()[:32]


def _claimed(value: str) -> tuple[str, str | None]:
    """``(request id, fingerprint)`` from a claim key's value (``None``: written without one,
    as a key restored from the ledger is)."""
    request_id, _, fingerprint = value.partition(" ")
    return request_id, fingerprint or None


class IdempotencySource(Protocol):
    """Where a lost key is looked up (``SqlLedger.idempotent_request``)."""

    async def idempotent_request(self, tenant: str, key: str, since: datetime) -> str | None: ...


class Idempotency:
    def __init__(
        self,
        redis: aioredis.Redis,
        prefix: str,
        *,
        ttl_s: int,
        ledger: IdempotencySource | None = None,
    ) -> None:
        """``ledger``: where keys lost with Redis are looked up (none: a lost key is new)."""
        self._redis = redis
        self._keys = RedisKeys(prefix)
        self._ttl_s = ttl_s
        self._ledger = ledger
        self._claim = redis.register_script(_CLAIM)
        self._release = redis.register_script(_RELEASE)

    def _key(self, tenant: str, key: str) -> str:
        return self._keys.idempotency_claim(tenant, key)

    def _result_key(self, tenant: str, key: str) -> str:
        return self._keys.idempotency_result(tenant, key)

    def _since(self, tenant: str) -> str:
        return self._keys.idempotency_tag(tenant)

    async def claim(
        self, tenant: str, key: str, request_id: str, fingerprint: str = ""
    ) -> str | None:
        """``None`` when this request is the first with ``key``; else the first one's id.
        Raises ``IdempotencyKeyMismatch`` when the first one's ``fingerprint``
        (``request_fingerprint``) differs from this one's, ``IdempotencyKeyReused`` when the
        ledger shows the key ran before Redis lost it, and ``ServiceUnavailable`` when the
        ledger cannot say."""
        name = self._key(tenant, key)
        check = "1" if self._ledger is not None else "0"
        value = f"{request_id} {fingerprint}" if fingerprint else request_id
        status, first = await self._claim(
            keys=[name, self._since(tenant)], args=[value, self._ttl_s, check, MARKER_TTL_S]
        )
        if int(status) == 1:
            return None
        if int(status) == 0:
            return self._same(_text(first), fingerprint)
        ran = await self._lookup(tenant, key)
        if ran is not None:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.set(name, ran, nx=True, ex=self._ttl_s)
                pipe.set(
                    self._result_key(tenant, key),
                    orjson.dumps({"reused": ran}),
                    nx=True,
                    ex=self._ttl_s,
                )
                await pipe.execute()
            raise self._reused(ran)
        if await self._redis.set(name, value, nx=True, ex=self._ttl_s):
            return None
        # another request claimed it meanwhile
        return self._same(_text(await self._redis.get(name)), fingerprint)

    def _same(self, claimed: str, fingerprint: str) -> str:
        """The first request's id, if its body is this one's (or either has no fingerprint)."""
        first, theirs = _claimed(claimed)
        if fingerprint and theirs is not None and theirs != fingerprint:
            raise IdempotencyKeyMismatch(
                f"this idempotency key was used by request {first} with a different body; "
                "use a new key for a new request"
            )
        return first

    async def release(self, tenant: str, key: str, request_id: str, fingerprint: str = "") -> None:
        """Give ``key`` up when the request that claimed it was refused before it could run
        (its queue full, say): a retry with the key then runs, instead of waiting for an answer
        that will never come. Only ``request_id``'s own claim is removed."""
        value = f"{request_id} {fingerprint}" if fingerprint else request_id
        await self._release(keys=[self._key(tenant, key)], args=[value])

    async def _lookup(self, tenant: str, key: str) -> str | None:
        assert self._ledger is not None
        since = datetime.now(UTC) - timedelta(seconds=self._ttl_s)
        try:
            async with asyncio.timeout(LOOKUP_TIMEOUT_S):
                return await self._ledger.idempotent_request(tenant, key, since)
        except (SQLAlchemyError, OSError, TimeoutError) as exc:
            raise ServiceUnavailable(f"idempotency keys unavailable: {type(exc).__name__}") from exc

    def _reused(self, first: str) -> IdempotencyKeyReused:
        return IdempotencyKeyReused(
            f"this idempotency key was used by request {first} in the last {self._ttl_s} s; "
            "its answer is no longer available, and the request is not run again"
        )

    async def store(self, tenant: str, key: str, reply: Answer) -> None:
        payload = orjson.dumps(
            {"r": reply.request_id, "k": reply.kind, "d": reply.data, "m": reply.meta.to_values()}
        )
        await self._redis.set(self._result_key(tenant, key), payload, ex=self._ttl_s)

    async def wait(self, tenant: str, key: str, deadline: float) -> FirstAnswer:
        """The first request's final reply, once there; ``DeadlineExceeded`` at ``deadline``;
        ``IdempotencyKeyReused`` when the first one's answer was lost with Redis."""
        name = self._result_key(tenant, key)
        while True:
            raw: Any = await self._redis.get(name)
            if raw is not None:
                data = orjson.loads(raw)
                if "reused" in data:
                    raise self._reused(str(data["reused"]))
                meta = ReplyMeta.from_values(data["m"])
                return FirstAnswer(data["r"], data["k"], data["d"], meta)
            if time.time() >= deadline:
                raise DeadlineExceeded("the first request with this idempotency key did not finish")
            await asyncio.sleep(_POLL_S)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
