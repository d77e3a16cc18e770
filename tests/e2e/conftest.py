"""The whole stack as real processes: three simulators and `tiergate serve`, real Redis, SQLite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import Stack

__all__ = ["Stack", "stack"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Stack]:
    with Stack.run(tmp_path_factory.mktemp("stack"), redis_url) as running:
        yield running
