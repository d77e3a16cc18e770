"""A Redis Cluster of the test's own: three masters and three replicas (``redis-server
--cluster-enabled yes`` on free ports, joined by ``redis-cli --cluster create``), that a test may
fail over; every process is stopped, and its files removed with the test's folder, on exit."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from typing import IO

import redis
from redis.cluster import RedisCluster, key_slot

from tests.support import free_port, wait_redis

__all__ = ["LocalRedisCluster"]


class LocalRedisCluster:
    def __init__(self, workdir: Path, *, masters: int = 3, replicas: int = 1) -> None:
        self.workdir = workdir
        self.ports = [_node_port() for _ in range(masters * (1 + replicas))]
        self.replicas = replicas
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self._logs: list[IO[bytes]] = []

    @property
    def url(self) -> str:
        """One node's URL: the client finds the others."""
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def _start_node(self, port: int) -> None:
        folder = self.workdir / f"redis-{port}"
        folder.mkdir(exist_ok=True)
        log = (folder / "redis.log").open("ab")
        self._logs.append(log)
        self.procs[port] = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
             "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
             "--cluster-node-timeout", "2000", "--save", "", "--appendonly", "no",
             "--dir", str(folder)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip

    def start(self) -> None:
        for port in self.ports:
            self._start_node(port)
        for port in self.ports:
            wait_redis(port)
        subprocess.run(
            ["redis-cli", "--cluster", "create",
             *(f"127.0.0.1:{p}" for p in self.ports),
             "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
        )  # fmt: skip
        self.wait_ok()
        self._wait_replicas_synced()

    def wait_ok(self, timeout_s: float = 30.0) -> None:
        """Until every node says ``cluster_state:ok`` and every slot is served."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(self._ok(port) for port in self.procs):
                return
            time.sleep(0.1)
        raise RuntimeError("the cluster did not become ok")

    def _wait_replicas_synced(self, timeout_s: float = 30.0) -> None:
        """Until every replica has its master's data (a replica that never synced is not
        promoted when its master dies)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(self._synced(port) for port in self.procs):
                return
            time.sleep(0.1)
        raise RuntimeError("the replicas did not sync")

    def _synced(self, port: int) -> bool:
        client = redis.Redis(port=port, socket_timeout=1)
        try:
            info = client.info("replication")
        except redis.RedisError:
            return False
        finally:
            client.close()
        return info.get("role") == "master" or info.get("master_link_status") == "up"

    def _ok(self, port: int) -> bool:
        client = redis.Redis(port=port, socket_timeout=1)
        try:
            info = client.cluster("info")
        except redis.RedisError:
            return False
        finally:
            client.close()
        return bool(
            info.get("cluster_state") == "ok" and str(info.get("cluster_slots_ok")) == "16384"
        )

    def masters(self) -> list[int]:
        client = RedisCluster(host="127.0.0.1", port=self.ports[0])
        try:
            return sorted(n.port for n in client.get_primaries())
        finally:
            client.close()

    def replica_of(self, master_port: int) -> int:
        client = redis.Redis(port=master_port)
        try:
            info = client.info("replication")
        finally:
            client.close()
        return int(info["slave0"]["port"])

    def fail_over(self, master_port: int) -> int:
        """``CLUSTER FAILOVER`` on the replica of ``master_port`` (a coordinated switch: the
        replica catches up first); its port, the new master, once every node's slot map says
        so (the other nodes learn it by gossip, some milliseconds after the replica)."""
        replica = self.replica_of(master_port)
        client = redis.Redis(port=replica)
        try:
            client.execute_command("CLUSTER FAILOVER")
            deadline = time.monotonic() + 30
            while client.info("replication")["role"] != "master" or any(
                master_port in self._masters_seen_by(port) for port in self.procs
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError("the failover did not happen")
                time.sleep(0.05)
        finally:
            client.close()
        return replica

    def master_of(self, key: str) -> int:
        """The port of the master serving ``key``'s slot, as a live node sees it."""
        slot = key_slot(key.encode())
        for start, end, master in self._slot_map(next(iter(self.procs))):
            if start <= slot <= end:
                return master
        raise AssertionError(f"no master serves slot {slot}")

    def _masters_seen_by(self, port: int) -> set[int]:
        return {master for _start, _end, master in self._slot_map(port)}

    @staticmethod
    def _slot_map(port: int) -> list[tuple[int, int, int]]:
        """``CLUSTER SLOTS`` as node ``port`` sees it: (first slot, last slot, master port)."""
        client = redis.Redis(port=port, socket_timeout=1)
        try:
            ranges = client.execute_command("CLUSTER SLOTS")
        finally:
            client.close()
        return [(int(start), int(end), int(master[1])) for start, end, master, *_ in ranges]

    def wait_replaced(self, dead: int, key: str, timeout_s: float = 30.0) -> int:
        """Until a master other than ``dead`` (killed) serves ``key``'s slot: its port."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                port = self.master_of(key)
            except redis.RedisError:
                port = dead
            if port != dead:
                return port
            time.sleep(0.05)
        raise RuntimeError(f"no replica took over from {dead} in {timeout_s}s")

    def kill(self, port: int) -> None:
        proc = self.procs.pop(port)
        proc.kill()
        proc.wait()

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.procs.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()


def _node_port() -> int:
    """A free port whose cluster bus port (+10000) is free too."""
    for _ in range(100):
        port = free_port()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port + 10_000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a cluster node")
