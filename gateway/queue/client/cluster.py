"""The Redis Cluster client: redis-py's ``RedisCluster``, with scripts allowed in pipelines.

redis-py refuses ``EVALSHA`` in a cluster pipeline; tiergate queues its scripts there (the
finish script behind the ledger event, the breakers' peeks, the edge's take-over beside a
``GET``). Here a pipeline sends each such script as ``EVAL`` with its text (known from
``register_script``): routed by its keys' slot like any command, and never ``NOSCRIPT`` after a
failover to a replica that has not loaded it. Every key a script declares shares one hash tag
(``gateway.queue.keys``), so each one runs on one node.

Keys read here, not asked of a node. redis-py asks its *default node* (the first master it
found) for the keys of a command it cannot parse alone (``COMMAND GETKEYS``), and an error from
that question does not make it read the cluster's slots again: once that node was killed, every
``XREAD`` and ``XREADGROUP`` (the edge's reply reader, the ledger sink) failed for good, whatever
node held the stream. Their keys are read from the command itself (the names after
``STREAMS``); for any other such command a failed question makes the client read the slots
again and ask once more, so once the failover is known it asks a live node.

Pipelines run ``MGET`` of one slot's keys (the queue snapshot's lane depths), which redis-py's
cluster pipeline refuses outright.

Pub/sub (the cancel channel, the rules' and keys' reload notices) subscribes on the node of the
channel's slot, once the client knows the slots (``_ReadySubscriber``); a cluster carries a
``PUBLISH`` to every node, so a publisher may use any.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio.cluster import ClusterNode, ClusterPipeline, ClusterPubSub, RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import EncodableT, KeyT

__all__ = ["ScriptingCluster"]


class ScriptingCluster(RedisCluster):
    """``RedisCluster`` whose pipelines run registered scripts (``EVAL`` with their text)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.script_texts: dict[str, bytes | str] = {}
        """sha1 -> the text of each script registered on this client."""

    def register_script(self, script: bytes | str) -> AsyncScript:  # type: ignore[override]
        registered = super().register_script(script)
        self.script_texts[registered.sha] = script
        return registered

    async def _determine_slot(self, command: str, *args: Any) -> int:
        streams = _stream_keys(command, args)
        if streams:
            slots = {self.keyslot(key) for key in streams}
            if len(slots) != 1:
                raise RedisClusterException(f"{command} - all keys must map to the same key slot")
            return slots.pop()
        try:
            return await super()._determine_slot(command, *args)
        except (RedisConnectionError, RedisTimeoutError):
            # The default node is gone. redis-py asks before its retry loop, so nothing would
            # ever read the slots again: read them (a new default node once the failover is
            # known) and ask once more.
            self._initialize = True
            await self.initialize()
            return await super()._determine_slot(command, *args)

    def pubsub(
        self,
        node: ClusterNode | None = None,
        host: str | None = None,
        port: int | None = None,
        **kwargs: Any,
    ) -> ClusterPubSub:
        return _ReadySubscriber(self, node=node, host=host, port=port, **kwargs)

    def pipeline(
        self, transaction: Any | None = None, shard_hint: Any | None = None
    ) -> ClusterPipeline:
        if shard_hint:
            raise ValueError("a cluster pipeline takes no shard_hint")
        return _ScriptingPipeline(self, transaction)  # type: ignore[abstract]  # redis-py's typing


def _stream_keys(command: str, args: tuple[Any, ...]) -> list[Any]:
    """The stream names of an ``XREAD``/``XREADGROUP`` (``… STREAMS k1 k2 id1 id2``), else
    nothing."""
    if command.upper() not in ("XREAD", "XREADGROUP"):
        return []
    for i, arg in enumerate(args):
        word = arg.decode() if isinstance(arg, bytes) else arg
        if isinstance(word, str) and word.upper() == "STREAMS":
            rest = args[i + 1 :]
            return list(rest[: len(rest) // 2])
    return []


class _ReadySubscriber(ClusterPubSub):
    """redis-py's cluster pub/sub picks the node of a channel's slot from the client's slot
    map, which is empty until the client has run a command (``KeyError``: a worker's cancel
    listener, the first user of its blocking client, died at start), and its lost connection
    never makes the client read the slots again (it would subscribe to the dead node again).
    Here the slots are read first, and again after a lost connection."""

    cluster: ScriptingCluster

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        await self.cluster.initialize()
        try:
            return await super().execute_command(*args, **kwargs)
        except (RedisConnectionError, RedisTimeoutError):
            self.cluster._initialize = True
            raise

    async def get_message(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().get_message(*args, **kwargs)
        except (RedisConnectionError, RedisTimeoutError):
            self.cluster._initialize = True
            raise


class _ScriptingPipeline(ClusterPipeline):
    def __init__(self, client: ScriptingCluster, transaction: bool | None = None) -> None:
        super().__init__(client, transaction)
        self._texts = client.script_texts
        self.scripts: set[AsyncScript] = set()
        """What callers add before ``evalsha`` on a standalone pipeline; not needed here."""

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: KeyT | EncodableT) -> ClusterPipeline:
        text = self._texts.get(sha)
        if text is None:
            return self.execute_command("EVALSHA", sha, numkeys, *keys_and_args)
        return self.execute_command("EVAL", text, numkeys, *keys_and_args)

    def eval(self, script: str, numkeys: int, *keys_and_args: KeyT | EncodableT) -> ClusterPipeline:
        return self.execute_command("EVAL", script, numkeys, *keys_and_args)

    def mget(self, keys: KeyT | list[KeyT], *args: KeyT) -> ClusterPipeline:  # type: ignore[override]
        """Refused by redis-py's cluster pipeline whatever the keys; routed by their slot like
        any command here (keys of more than one slot: ``RedisClusterException``)."""
        names = [*keys, *args] if isinstance(keys, list) else [keys, *args]
        return self.execute_command("MGET", *names)
