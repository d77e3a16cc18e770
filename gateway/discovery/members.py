"""The replicas of every vLLM deployment as they are now: fixed ones from the config, and the
ready pods that discovery finds (``gateway.discovery.kube``, ``gateway.discovery.dns``).

A ``Member`` is one replica: its name (the backend name, which also names its slot lease set and
its conversation-affinity weight), its base URL and its slots. ``ReplicaDirectory`` holds the
members of each deployment and tells its listeners, one deployment at a time, when they change.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gateway.settings import DeploymentSettings, Settings

__all__ = ["Listener", "Member", "ReplicaDirectory", "pod_member", "pod_slots"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Member:
    name: str
    """``<model>#<i>`` for a configured replica, ``<model>@<pod>`` for a discovered pod."""
    url: str
    max_num_seqs: int


Listener = Callable[[str, Sequence[Member]], None]
"""Called with a deployment and its members, after they changed."""


def pod_slots(settings: Settings, dep: DeploymentSettings) -> int:
    """Slots of each pod of a discovered deployment (``kubernetes.pod_slots`` wins)."""
    assert dep.discovery is not None
    return settings.kubernetes.pod_slots.get(dep.discovery.service, dep.discovery.max_num_seqs)


def pod_member(dep: DeploymentSettings, pod: str, url: str, slots: int) -> Member:
    return Member(f"{dep.model}@{pod}", url, slots)


def _fixed(dep: DeploymentSettings) -> tuple[Member, ...]:
    if dep.provider != "vllm":
        return ()
    return tuple(
        Member(f"{dep.model}#{i}", r.url, r.max_num_seqs) for i, r in enumerate(dep.replicas)
    )


class ReplicaDirectory:
    def __init__(self, settings: Settings) -> None:
        self._members: dict[str, tuple[Member, ...]] = {
            d.model: _fixed(d) for d in settings.deployments if d.provider == "vllm"
        }
        self._discovered = frozenset(
            d.model for d in settings.deployments if d.discovery is not None
        )
        self._listeners: list[Listener] = []

    @property
    def discovered(self) -> frozenset[str]:
        """The deployments whose members discovery finds."""
        return self._discovered

    def members(self, deployment: str) -> tuple[Member, ...]:
        return self._members.get(deployment, ())

    def all(self) -> Mapping[str, tuple[Member, ...]]:
        return dict(self._members)

    def listen(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def update(self, deployment: str, members: Sequence[Member]) -> None:
        """Set a discovered deployment's members (sorted by name); listeners hear of a change."""
        if deployment not in self._discovered:
            raise KeyError(deployment)
        new = tuple(sorted(members, key=lambda m: m.name))
        if new == self._members.get(deployment):
            return
        old = {m.name for m in self._members.get(deployment, ())}
        self._members[deployment] = new
        names = {m.name for m in new}
        log.info(
            "replicas of %s: %d (joined: %s; left: %s)",
            deployment,
            len(new),
            ", ".join(sorted(names - old)) or "-",
            ", ".join(sorted(old - names)) or "-",
        )
        for listener in self._listeners:
            listener(deployment, new)
