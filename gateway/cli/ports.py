"""Whether the ports a local stack would listen on are free, before anything is started.

``tiergate up`` and ``tiergate demo`` start simulators and a gateway on the ports the config
names. Something else already listening there must stop them with a clear message, not leave
them talking to a stranger (a demo that waited on whatever answered ``/readyz`` printed rows of
"-" and exited 0).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from gateway.settings import Settings

__all__ = ["Endpoint", "stack_endpoints", "taken"]


@dataclass(frozen=True, slots=True)
class Endpoint:
    what: str
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port} ({self.what})"


def stack_endpoints(settings: Settings) -> list[Endpoint]:
    """What ``tiergate up`` listens on: the config's simulators, the gateway, its admin port."""
    endpoints = [Endpoint(f"simulator {s.profile}", s.host, s.port) for s in settings.simulators]
    endpoints.append(Endpoint("gateway", settings.server.host, settings.server.port))
    endpoints.append(Endpoint("admin port", settings.server.admin_host, settings.server.admin_port))
    return endpoints


def taken(endpoints: list[Endpoint]) -> list[Endpoint]:
    """The endpoints that cannot be bound now (as the servers will bind them: with
    ``SO_REUSEADDR``, so a port in TIME_WAIT counts as free)."""
    busy = []
    for endpoint in endpoints:
        family = socket.AF_INET6 if ":" in endpoint.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((endpoint.host, endpoint.port))
            except OSError:
                busy.append(endpoint)
    return busy
