"""Discovery through the Kubernetes API: a pool's ready pods, followed through list and watch
of its Service's EndpointSlices, scaling 1 -> 3 -> 0 (``gateway.discovery.kube``)."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from gateway.discovery.members import Member, ReplicaDirectory
from gateway.discovery.wiring import start_discovery
from gateway.settings import Settings
from tests.gateway.discovery.fake_kube import FakeKube, Pod
from tests.support import until

SPOT = "llama-3.1-8b-instruct-spot"


def settings_with_discovery(kubernetes: dict[str, Any], **discovery: Any) -> Settings:
    return Settings(
        kubernetes=kubernetes,
        deployments=[
            {
                "model": SPOT,
                "tier": "small",
                "discovery": {"service": "vllm-llama-8b-spot", "max_num_seqs": 4, **discovery},
            }
        ],
    )


async def _follow(directory: ReplicaDirectory, expect: set[str], timeout_s: float = 3.0) -> float:
    started = time.monotonic()
    await until(lambda: {m.name for m in directory.members(SPOT)} == expect, timeout_s)
    return time.monotonic() - started


async def test_pods_are_followed_up_and_down(kube: tuple[FakeKube, dict[str, Any]]) -> None:
    fake, api = kube
    fake.set_pods({"a": Pod("10.0.0.1", 8000)})
    settings = settings_with_discovery(api)
    directory = ReplicaDirectory(settings)
    heard: list[tuple[str, ...]] = []
    directory.listen(lambda _d, members: heard.append(tuple(m.name for m in members)))
    async with contextlib.AsyncExitStack() as stack:
        await start_discovery(settings, directory, stack)
        # the first list is in before start_discovery returns
        assert directory.members(SPOT) == (Member(f"{SPOT}@a", "http://10.0.0.1:8000", 4),)

        fake.set_pods({p: Pod(f"10.0.0.{i + 1}", 8000) for i, p in enumerate("abc")})
        up = await _follow(directory, {f"{SPOT}@a", f"{SPOT}@b", f"{SPOT}@c"})

        # a pod being deleted turns not ready (terminating) first: it leaves at once
        fake.set_pods(
            {
                "a": Pod("10.0.0.1", 8000),
                "b": Pod("10.0.0.2", 8000, ready=False, terminating=True),
                "c": Pod("10.0.0.3", 8000),
            }
        )
        await _follow(directory, {f"{SPOT}@a", f"{SPOT}@c"})

        fake.set_pods({})
        down = await _follow(directory, set())
    assert up < 1.0 and down < 1.0, (up, down)
    assert heard[-1] == ()
    # least privilege: only list and watch of this Service's slices, as the pod's ServiceAccount
    assert {m for m, _, _ in fake.requests} == {"GET"}
    assert {q["labelSelector"] for _, _, q in fake.requests} == {
        "kubernetes.io/service-name=vllm-llama-8b-spot"
    }
    assert any(q.get("watch") == "1" for _, _, q in fake.requests)


async def test_an_expired_watch_lists_again_and_misses_nothing(
    kube: tuple[FakeKube, dict[str, Any]],
) -> None:
    fake, api = kube
    fake.set_pods({"a": Pod("10.0.0.1", 8000)})
    settings = settings_with_discovery(api)
    directory = ReplicaDirectory(settings)
    async with contextlib.AsyncExitStack() as stack:
        await start_discovery(settings, directory, stack)
        lists_before = sum(1 for _, _, q in fake.requests if "watch" not in q)
        await until(lambda: fake.watches, 2.0)
        fake.expire_watches()  # 410: the version the watch runs from is gone
        fake.set_pods({"a": Pod("10.0.0.1", 8000), "b": Pod("10.0.0.2", 8000)})
        await _follow(directory, {f"{SPOT}@a", f"{SPOT}@b"})
        assert sum(1 for _, _, q in fake.requests if "watch" not in q) > lists_before


async def test_members_stay_while_the_api_server_is_away(
    kube: tuple[FakeKube, dict[str, Any]],
) -> None:
    """A refused token (or an API server that blinks) keeps the pods known so far: discovery
    retries with backoff; it does not drop a pool because the control plane is unreachable."""
    fake, api = kube
    fake.set_pods({"a": Pod("10.0.0.1", 8000)})
    settings = settings_with_discovery(api)
    directory = ReplicaDirectory(settings)
    async with contextlib.AsyncExitStack() as stack:
        await start_discovery(settings, directory, stack)
        await until(lambda: fake.watches, 2.0)
        real_token, fake.token = fake.token, "rotated"
        fake.close_watches()  # the watch ends; the relist is refused (401)
        await until(lambda: sum(1 for _, _, q in fake.requests if "watch" not in q) >= 3, 5.0)
        assert [m.name for m in directory.members(SPOT)] == [f"{SPOT}@a"]
        fake.token = real_token
        fake.set_pods({"b": Pod("10.0.0.2", 8000)})
        await _follow(directory, {f"{SPOT}@b"}, timeout_s=5.0)


async def test_slots_per_pod_follow_a_serving_switch(
    kube: tuple[FakeKube, dict[str, Any]],
) -> None:
    fake, api = kube
    fake.set_pods({"a": Pod("10.0.0.1", 8000)})
    settings = settings_with_discovery({**api, "pod_slots": {"vllm-llama-8b-spot": 64}})
    directory = ReplicaDirectory(settings)
    async with contextlib.AsyncExitStack() as stack:
        await start_discovery(settings, directory, stack)
        assert [m.max_num_seqs for m in directory.members(SPOT)] == [64]
