"""The image's HEALTHCHECK: one GET to the health endpoint of whatever the container runs.

``tiergate serve`` and ``tiergate worker`` answer ``/healthz`` on their admin port
(``TIERGATE_SERVER__ADMIN_PORT``, 9464 unless set); ``tiergate sim`` answers ``/health`` on the
port its command line names. The command is read from PID 1's command line (tini, then the
tiergate command). ``TIERGATE_HEALTHCHECK_URL`` overrides it all. Exit 0: healthy.
"""

from __future__ import annotations

import os
import sys
import urllib.request
from collections.abc import Mapping, Sequence


def _option(args: Sequence[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def health_url(args: Sequence[str], env: Mapping[str, str]) -> str:
    if env.get("TIERGATE_HEALTHCHECK_URL"):
        return env["TIERGATE_HEALTHCHECK_URL"]
    if "sim" in args:
        return f"http://127.0.0.1:{_option(args, '--port') or '8000'}/health"
    return f"http://127.0.0.1:{env.get('TIERGATE_SERVER__ADMIN_PORT') or '9464'}/healthz"


def pid1_args(path: str = "/proc/1/cmdline") -> list[str]:
    try:
        with open(path, "rb") as f:
            return [a.decode() for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def check(url: str, timeout_s: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (loopback)
            return 0 if resp.status == 200 else 1
    except OSError:
        return 1


if __name__ == "__main__":
    sys.exit(check(health_url(pid1_args(), os.environ)))
