"""Shared fixtures: the real Redis and PostgreSQL the tests use, isolated per run."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis

from tests.support import drop_prefix, new_prefix

REDIS_URL = os.environ.get("TIERGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
DATABASE_URL = os.environ.get(
    "TIERGATE_TEST_DATABASE_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
)


@pytest.fixture(scope="session")
def redis_url() -> str:
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.ConnectionError as exc:  # a real Redis is required, never skipped
        pytest.fail(f"tests need a Redis at {REDIS_URL} (TIERGATE_TEST_REDIS_URL): {exc}")
    finally:
        client.close()
    return REDIS_URL


@pytest.fixture
def key_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test's own; its keys are deleted afterwards."""
    prefix = new_prefix()
    yield prefix
    drop_prefix(redis_url, prefix)
