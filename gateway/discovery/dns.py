"""A vLLM pool's ready pods from a headless Service's DNS name, resolved every few seconds.

A headless Service (``clusterIP: None``) answers its name with the address of every ready pod
behind it, so resolving it is a discovery with no API access. It is slower to follow than the
EndpointSlice watch (``dns_interval_s`` plus the DNS server's own cache, 5-30 s on common
cluster setups) and knows no pod names: each member is named after its address. A name that
does not exist (no ready pod) means no members; a lookup that fails otherwise keeps the members
as they were.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Sequence

from gateway.discovery.first_answer import FirstAnswer
from gateway.discovery.members import Member, pod_member
from gateway.loops import Loop
from gateway.settings import DeploymentSettings

__all__ = ["DnsSource"]

log = logging.getLogger(__name__)

_NO_SUCH_NAME = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


class DnsSource:
    def __init__(
        self,
        dep: DeploymentSettings,
        on_members: Callable[[str, Sequence[Member]], None],
        *,
        slots: int,
    ) -> None:
        assert dep.discovery is not None and isinstance(dep.discovery.port, int)
        self._dep = dep
        self._slots = slots
        self._host = dep.discovery.service
        self._port = dep.discovery.port
        self._scheme = dep.discovery.scheme
        self._on_members = on_members
        self._synced = FirstAnswer()
        self._loop = Loop(
            f"discovery-{dep.model}", self.refresh, every_s=dep.discovery.dns_interval_s
        )

    async def resolve(self) -> list[Member] | None:
        """The members now; ``None``: the lookup failed (keep what we had)."""
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(self._host, self._port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            if exc.errno in _NO_SUCH_NAME:
                return []
            log.warning("cannot resolve %s: %s", self._host, exc)
            return None
        addresses = sorted({str(info[4][0]) for info in infos})
        return [
            pod_member(
                self._dep,
                a,
                f"{self._scheme}://{f'[{a}]' if ':' in a else a}:{self._port}",
                self._slots,
            )
            for a in addresses
        ]

    async def refresh(self) -> None:
        members = await self.resolve()
        if members is not None:
            self._on_members(self._dep.model, members)
            self._synced.set()

    def start(self) -> None:
        self._loop.start()

    async def synced(self, timeout_s: float) -> bool:
        """Wait until the first lookup is in (``False``: not within ``timeout_s``)."""
        return await self._synced.wait(timeout_s)

    async def aclose(self) -> None:
        await self._loop.aclose()
