"""Discovery by a headless Service's DNS name (``gateway.discovery.dns``): each address the name
resolves to is a pod; a name that does not resolve (no ready pod) is an empty pool."""

from __future__ import annotations

import pytest

from gateway.discovery.dns import DnsSource
from gateway.discovery.members import Member
from gateway.settings import Settings


def _source(host: str, heard: list[list[Member]]) -> DnsSource:
    settings = Settings(
        deployments=[
            {
                "model": "m",
                "tier": "small",
                "discovery": {"mode": "dns", "service": host, "port": 8000, "max_num_seqs": 8},
            }
        ]
    )
    return DnsSource(settings.deployments[0], lambda _d, m: heard.append(list(m)), slots=8)


async def test_each_address_is_a_member() -> None:
    heard: list[list[Member]] = []
    await _source("localhost", heard).refresh()
    assert Member("m@127.0.0.1", "http://127.0.0.1:8000", 8) in heard[-1]


async def test_a_name_without_pods_is_an_empty_pool() -> None:
    heard: list[list[Member]] = []
    await _source("no-such-pool.invalid", heard).refresh()
    assert heard == [[]]


def test_dns_discovery_needs_a_port_number() -> None:
    with pytest.raises(ValueError, match="port number"):
        Settings(
            deployments=[
                {
                    "model": "m",
                    "tier": "small",
                    "discovery": {"mode": "dns", "service": "x", "port": "http"},
                }
            ]
        )
