"""An embedded Redis for one machine: a local ``redis-server`` on a free loopback port.

Used only when the config names no Redis URL. A configured Redis that is unreachable is an
error, never a reason to start this one.

It persists like the deployed ones (``deploy/``): AOF on (``appendonly yes``, ``appendfsync
everysec``) in a data directory that outlives the process (``redis.embedded_dir``, beside the
SQLite ledger by default). What it held (ledger events waiting for SQL, queued jobs, claims,
notes) is there again after a restart: of the gateway, which starts a new server on the same
directory, or of the server alone, which ``ensure_running`` restarts on the same port. A
``kill -9`` of the server loses nothing it acknowledged (each write reaches the file before the
reply; the every-second fsync matters only when the machine itself goes down).

One server per directory: the directory is locked (``flock``) by the process that started the
server and by the server itself, so a second gateway on the same directory is refused with a
clear message, even while an orphaned server of a dead gateway still runs there. The server's
URL is written beside it (``redis.url``): the CLI finds the running gateway's Redis there
(``running_url``) and announces key and tenant changes on it, as the admin API does.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import IO

import redis

__all__ = ["EmbeddedRedis", "EmbeddedRedisError"]

log = logging.getLogger(__name__)


class EmbeddedRedisError(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedRedis:
    def __init__(self, binary: str | None = None, *, data_dir: Path) -> None:
        found = binary or shutil.which("redis-server")
        if found is None:
            raise EmbeddedRedisError(
                "no Redis URL is configured and no redis-server binary is on PATH: "
                "install redis-server or set redis.url (TIERGATE_REDIS__URL)"
            )
        self._binary = found
        self.data_dir = Path(data_dir).resolve()
        self.port = _free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock: IO[bytes] | None = None
        self._guard = threading.Lock()  # ensure_running (in a thread) against stop

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @staticmethod
    def running_url(data_dir: Path) -> str | None:
        """The URL of the embedded server running on ``data_dir`` now (started by another
        process), or ``None`` when none runs there."""
        url_file, lock_file = Path(data_dir) / "redis.url", Path(data_dir) / "tiergate.lock"
        if not url_file.exists() or not lock_file.exists():
            return None
        with lock_file.open("rb") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:  # held: a server runs there
                return url_file.read_text().strip() or None
            fcntl.flock(lock, fcntl.LOCK_UN)
        return None

    def start(self, timeout_s: float = 30.0) -> str:
        """Start the server on its directory (what an earlier one wrote there is loaded)."""
        self._claim_directory()
        try:
            self._launch(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self.url

    def ensure_running(self, timeout_s: float = 30.0) -> bool:
        """Restart the server, on the same port and directory, if it has exited since
        ``start``; whether it did."""
        with self._guard:
            if self._proc is None or self._proc.poll() is None:
                return False
            self._restart(timeout_s)
            return True

    def _restart(self, timeout_s: float) -> None:
        assert self._proc is not None
        log.warning(
            "embedded redis-server exited with %s; restarting it on port %d from %s",
            self._proc.returncode, self.port, self.data_dir,
        )  # fmt: skip
        self._launch(timeout_s)

    async def supervise(self, every_s: float = 1.0) -> None:
        """Run ``ensure_running`` every ``every_s`` until cancelled (a crashed server comes back
        with what its AOF holds; meanwhile Redis commands fail, as with any lost Redis)."""
        while True:
            await asyncio.sleep(every_s)
            try:
                await asyncio.to_thread(self.ensure_running)
            except EmbeddedRedisError as exc:
                log.error("cannot restart the embedded redis-server: %s", exc)

    def stop(self) -> None:
        """Stop the server (it writes its AOF out first) and release the directory, which is
        kept for the next start."""
        with self._guard:
            self._stop()

    def _stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def _claim_directory(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        lock = (self.data_dir / "tiergate.lock").open("wb")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise EmbeddedRedisError(
                f"another embedded redis-server uses {self.data_dir}: stop it, or give this "
                "one a directory of its own (redis.embedded_dir, TIERGATE_REDIS__EMBEDDED_DIR)"
            ) from None
        self._lock = lock

    def _launch(self, timeout_s: float) -> None:
        assert self._lock is not None
        args = [
            self._binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--dir", str(self.data_dir),
            "--logfile", str(self.data_dir / "redis.log"),
        ]  # fmt: skip
        # The server holds the directory's lock too (an inherited descriptor), so the directory
        # stays taken for as long as the server lives, even if this process dies first. Its own
        # session: a terminal's Ctrl-C (SIGINT to the whole foreground group) reaches only
        # tiergate, which drains its work and then stops the server (``stop``).
        self._proc = subprocess.Popen(  # noqa: S603
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(self._lock.fileno(),),
            start_new_session=True,
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if self._proc.poll() is not None:
                    raise EmbeddedRedisError(
                        f"redis-server exited with {self._proc.returncode} "
                        f"(see {self.data_dir / 'redis.log'})"
                    )
                try:
                    client.ping()
                    (self.data_dir / "redis.url").write_text(self.url + "\n")
                    return
                except redis.ConnectionError:  # not up yet, or still loading its AOF
                    time.sleep(0.05)
        finally:
            client.close()
        raise EmbeddedRedisError("embedded redis-server did not answer in time")
