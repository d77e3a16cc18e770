"""A Kubernetes API server that knows one thing: EndpointSlices, listed and watched as the real
one serves them (``discovery.k8s.io/v1`` JSON, a watch as one JSON event per line, bookmarks
aside). The test sets the pods behind a Service; each change is an event on every open watch.

Each pod gets an EndpointSlice of its own (the real controller groups endpoints by port; the
simulators standing in for pods listen on one port each, all on 127.0.0.1).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

__all__ = ["FakeKube", "Pod"]


@dataclass(frozen=True)
class Pod:
    ip: str
    port: int
    ready: bool = True
    terminating: bool = False


@dataclass
class FakeKube:
    token: str
    namespace: str = "tiergate"
    service: str = "vllm-llama-8b-spot"
    version: int = 100
    slices: dict[str, dict[str, Any]] = field(default_factory=dict)
    watches: list[asyncio.Queue[dict[str, Any] | None]] = field(default_factory=list)
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    """(method, path, query) of every request."""
    oldest: int = 0
    """Watches from a version older than this get 410 Gone."""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    def _slice(self, name: str, pod: str, spec: Pod) -> dict[str, Any]:
        return {
            "kind": "EndpointSlice",
            "apiVersion": "discovery.k8s.io/v1",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "resourceVersion": str(self.version),
                "labels": {"kubernetes.io/service-name": self.service},
            },
            "addressType": "IPv4",
            "endpoints": [
                {
                    "addresses": [spec.ip],
                    "conditions": {
                        "ready": spec.ready,
                        "serving": spec.ready or spec.terminating,
                        "terminating": spec.terminating,
                    },
                    "targetRef": {"kind": "Pod", "namespace": self.namespace, "name": pod},
                }
            ],
            "ports": [{"name": "http", "port": spec.port, "protocol": "TCP"}],
        }

    def set_pods(self, pods: Mapping[str, Pod]) -> None:
        """The pods behind the Service from now on: an event per slice added, changed or gone."""
        wanted = {f"{self.service}-{pod}": (pod, spec) for pod, spec in pods.items()}
        for name in [n for n in self.slices if n not in wanted]:
            self.version += 1
            gone = self.slices.pop(name)
            gone["metadata"]["resourceVersion"] = str(self.version)
            self._emit({"type": "DELETED", "object": gone})
        for name, (pod, spec) in wanted.items():
            before = self.slices.get(name)
            obj = self._slice(name, pod, spec)
            if before is not None and before["endpoints"] == obj["endpoints"]:
                continue
            self.version += 1
            obj["metadata"]["resourceVersion"] = str(self.version)
            self.slices[name] = obj
            self._emit({"type": "MODIFIED" if before else "ADDED", "object": obj})

    def expire_watches(self) -> None:
        """Versions so far are too old now (etcd compaction): open watches get an ERROR 410."""
        self.oldest = self.version + 1
        self._emit(
            {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
        )

    def _emit(self, event: dict[str, Any]) -> None:
        for queue in self.watches:
            queue.put_nowait(event)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.method, request.path, dict(request.query)))
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response({"kind": "Status", "code": 401}, status=401)
        path = f"/apis/discovery.k8s.io/v1/namespaces/{self.namespace}/endpointslices"
        if request.method != "GET" or request.path != path:
            return web.json_response({"kind": "Status", "code": 403}, status=403)
        if request.query.get("labelSelector") != f"kubernetes.io/service-name={self.service}":
            return web.json_response({"kind": "EndpointSliceList", "items": []})
        if request.query.get("watch") in ("1", "true"):
            return await self._watch(request)
        return web.json_response(
            {
                "kind": "EndpointSliceList",
                "apiVersion": "discovery.k8s.io/v1",
                "metadata": {"resourceVersion": str(self.version)},
                "items": list(self.slices.values()),
            }
        )

    async def _watch(self, request: web.Request) -> web.StreamResponse:
        if int(request.query.get("resourceVersion") or 0) < self.oldest:
            return web.json_response({"kind": "Status", "code": 410}, status=410)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.watches.append(queue)
        try:
            while (event := await queue.get()) is not None:
                await response.write(json.dumps(event).encode() + b"\n")
                if event["type"] == "ERROR":
                    break
        finally:
            self.watches.remove(queue)
        return response

    def close_watches(self) -> None:
        for queue in self.watches:
            queue.put_nowait(None)
