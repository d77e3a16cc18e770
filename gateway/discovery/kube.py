"""A vLLM pool's ready pods from its Service's EndpointSlices, through the Kubernetes API.

The standard list-then-watch: ``GET /apis/discovery.k8s.io/v1/namespaces/<ns>/endpointslices``
with ``labelSelector=kubernetes.io/service-name=<service>``, then a watch from the list's
``resourceVersion`` (bookmarks on, restarted from the last version seen when the server ends
it). A ``410 Gone`` (the version is too old) or a broken connection starts over with a new list,
after a backoff while the API server cannot be reached (the members stay as they were
meanwhile: a pod is not dropped because the API server blinked).

Every endpoint whose ``conditions.ready`` is true (or absent, which Kubernetes defines as ready)
is a member, named after its pod. A pod being deleted turns ``ready: false, terminating: true``
at once, before its ``preStop`` hook runs: it leaves the members then, so it gets no new work
while the calls it holds finish (vLLM's ``--shutdown-timeout``).

What the pod's ServiceAccount needs, and nothing more: a Role allowing ``list`` and
``watch`` of ``endpointslices`` in the pool's namespace (``deploy/k8s/base/rbac.yaml``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential

from gateway.discovery.first_answer import FirstAnswer
from gateway.discovery.members import Member, pod_member
from gateway.settings import DeploymentSettings, KubernetesSettings
from gateway.tasks import stop_task

__all__ = ["EndpointSliceSource", "endpoints_of"]

log = logging.getLogger(__name__)

_WATCH_S = 290
"""How long the API server keeps one watch open (``timeoutSeconds``) before we renew it."""


class _Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): list again."""


class _ApiError(Exception):
    """The API server refused or failed a request (anything but 200)."""


_TRANSIENT = (aiohttp.ClientError, OSError, TimeoutError, _ApiError, ValueError)


@dataclass(frozen=True, slots=True)
class _Endpoint:
    pod: str
    url: str


def _port(slice_: Mapping[str, Any], want: int | str) -> int | None:
    if isinstance(want, int):
        return want
    ports = slice_.get("ports") or []
    named = [p.get("port") for p in ports if p.get("name") == want]
    if named and isinstance(named[0], int):
        return named[0]
    return None


def endpoints_of(slice_: Mapping[str, Any], port: int | str, scheme: str) -> list[_Endpoint]:
    """The ready endpoints of one EndpointSlice object, one per pod (its first address)."""
    number = _port(slice_, port)
    if number is None:
        return []
    out: list[_Endpoint] = []
    for endpoint in slice_.get("endpoints") or []:
        conditions = endpoint.get("conditions") or {}
        addresses = endpoint.get("addresses") or []
        if conditions.get("ready") is False or not addresses:
            continue
        address = str(addresses[0])
        host = f"[{address}]" if ":" in address else address
        ref = endpoint.get("targetRef") or {}
        pod = str(ref.get("name") or endpoint.get("hostname") or address)
        out.append(_Endpoint(pod, f"{scheme}://{host}:{number}"))
    return out


class EndpointSliceSource:
    def __init__(
        self,
        dep: DeploymentSettings,
        api: KubernetesSettings,
        session: aiohttp.ClientSession,
        on_members: Callable[[str, Sequence[Member]], None],
        *,
        slots: int,
    ) -> None:
        """``session``: for the API server only (its own connector, TLS with the API's CA);
        ``on_members(deployment, members)`` after each change (``ReplicaDirectory.update``);
        ``slots``: per pod (``pod_slots``)."""
        assert dep.discovery is not None
        self._dep = dep
        self._slots = slots
        self._disc = dep.discovery
        self._api = api
        self._session = session
        self._on_members = on_members
        self._slices: dict[str, list[_Endpoint]] = {}
        self._synced = FirstAnswer()
        self._task: asyncio.Task[None] | None = None
        self._ssl: ssl.SSLContext | None = None
        if api.api_url.startswith("https://"):
            cafile = str(api.ca_file) if api.ca_file is not None and api.ca_file.exists() else None
            self._ssl = ssl.create_default_context(cafile=cafile)

    # -- requests ---------------------------------------------------------------------------

    def _namespace(self) -> str:
        if self._disc.namespace:
            return self._disc.namespace
        return self._api.namespace_file.read_text(encoding="utf-8").strip()

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        token_file = self._api.token_file
        if token_file is not None and token_file.exists():
            headers["Authorization"] = f"Bearer {token_file.read_text(encoding='utf-8').strip()}"
        return headers

    def _url(self) -> str:
        base = self._api.api_url.rstrip("/")
        return f"{base}/apis/discovery.k8s.io/v1/namespaces/{self._namespace()}/endpointslices"

    def _params(self) -> dict[str, str]:
        return {"labelSelector": f"kubernetes.io/service-name={self._disc.service}"}

    async def _list(self) -> str:
        timeout = aiohttp.ClientTimeout(total=10)
        async with self._session.get(
            self._url(), params=self._params(), headers=self._headers(), ssl=self._ssl or True,
            timeout=timeout,
        ) as resp:  # fmt: skip
            if resp.status != 200:
                raise _ApiError(f"list endpointslices: HTTP {resp.status}")
            body = await resp.json(content_type=None)
        self._slices = {
            str(item["metadata"]["name"]): endpoints_of(item, self._disc.port, self._disc.scheme)
            for item in body.get("items") or []
        }
        self._publish()
        self._synced.set()
        return str(body.get("metadata", {}).get("resourceVersion", ""))

    async def _watch(self, version: str) -> str:
        """Follow changes from ``version`` until the server ends the watch; the last version
        seen. Raises ``_Gone`` when the version is too old."""
        params = {
            **self._params(),
            "watch": "1",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(_WATCH_S),
        }
        timeout = aiohttp.ClientTimeout(total=None, connect=10, sock_read=_WATCH_S + 30)
        async with self._session.get(
            self._url(), params=params, headers=self._headers(), ssl=self._ssl or True,
            timeout=timeout,
        ) as resp:  # fmt: skip
            if resp.status == 410:
                raise _Gone
            if resp.status != 200:
                raise _ApiError(f"watch endpointslices: HTTP {resp.status}")
            async for line in resp.content:
                if line.strip():
                    version = self._event(json.loads(line)) or version
        return version

    def _event(self, event: Mapping[str, Any]) -> str | None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Gone
            raise _ApiError(f"watch error: {obj.get('message', obj)}")
        meta = obj.get("metadata") or {}
        version = meta.get("resourceVersion")
        name = str(meta.get("name", ""))
        if kind in ("ADDED", "MODIFIED"):
            self._slices[name] = endpoints_of(obj, self._disc.port, self._disc.scheme)
            self._publish()
        elif kind == "DELETED":
            self._slices.pop(name, None)
            self._publish()
        return str(version) if version else None

    def _publish(self) -> None:
        pods = {e.pod: e.url for group in self._slices.values() for e in group}
        members = [pod_member(self._dep, pod, url, self._slots) for pod, url in pods.items()]
        self._on_members(self._dep.model, members)

    # -- lifecycle --------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            retrying = AsyncRetrying(
                retry=retry_if_exception_type(_TRANSIENT),
                wait=wait_exponential(multiplier=0.2, max=self._api.retry_max_s),
                before_sleep=lambda state: log.warning(
                    "cannot list the endpointslices of %s (%s); retrying",
                    self._disc.service,
                    type(state.outcome.exception()).__name__ if state.outcome else "?",
                ),
            )
            version: str = await retrying(self._list)
            try:
                while True:  # the server ends each watch after _WATCH_S; go on from there
                    version = await self._watch(version)
            except _Gone:
                continue
            except _TRANSIENT as exc:
                log.warning("watch of %s broke (%s)", self._disc.service, type(exc).__name__)
                await asyncio.sleep(min(1.0, self._api.retry_max_s))

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"discovery-{self._dep.model}")

    async def synced(self, timeout_s: float) -> bool:
        """Wait until the first list is in (``False``: not within ``timeout_s``)."""
        return await self._synced.wait(timeout_s)

    async def aclose(self) -> None:
        if self._task is not None:
            await stop_task(self._task)
            self._task = None
