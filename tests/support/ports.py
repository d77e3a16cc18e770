"""Free ports for the test's own servers."""

from __future__ import annotations

import random
import socket

__all__ = ["free_port"]

_PORTS = (20_000, 32_000)
"""Where test servers listen: below Linux's ephemeral range (32768-60999), which the kernel
hands to outgoing connections. A port the kernel picks for us (bind to 0) comes from that range,
and between our check and the server's bind an outgoing connection of another test could take
it ("address already in use", seen in CI)."""


def free_port() -> int:
    """A port nothing listens on now, outside the ephemeral range; random, so parallel test
    processes rarely pick the same one."""
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(*_PORTS)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # a crowded range
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
