"""An embedded Redis for one machine: a local ``redis-server`` on a free loopback port.

Used only when the config names no Redis URL. A configured Redis that is unreachable is an
error, never a reason to start this one.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

__all__ = ["EmbeddedRedis", "EmbeddedRedisError"]


class EmbeddedRedisError(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedRedis:
    def __init__(self, binary: str | None = None) -> None:
        found = binary or shutil.which("redis-server")
        if found is None:
            raise EmbeddedRedisError(
                "no Redis URL is configured and no redis-server binary is on PATH: "
                "install redis-server or set redis.url (TIERGATE_REDIS__URL)"
            )
        self._binary = found
        self._dir = tempfile.TemporaryDirectory(prefix="tiergate-redis-")
        self.port = _free_port()
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> str:
        args = [
            self._binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", self._dir.name,
            "--logfile", str(Path(self._dir.name) / "redis.log"),
        ]  # fmt: skip
        self._proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # noqa: S603
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if self._proc.poll() is not None:
                    raise EmbeddedRedisError(f"redis-server exited with {self._proc.returncode}")
                try:
                    client.ping()
                    return self.url
                except redis.ConnectionError:
                    time.sleep(0.05)
        finally:
            client.close()
        self.stop()
        raise EmbeddedRedisError("embedded redis-server did not answer in time")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        self._dir.cleanup()
