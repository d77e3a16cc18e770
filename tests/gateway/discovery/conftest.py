"""A fake Kubernetes API server (``fake_kube.FakeKube``) on a free port, and the settings that
point discovery at it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.gateway.discovery.fake_kube import FakeKube


@pytest.fixture
async def kube(tmp_path: Path) -> AsyncIterator[tuple[FakeKube, dict[str, Any]]]:
    """The server, and the ``kubernetes`` settings (as config data) that reach it as a pod's
    ServiceAccount would: a token file, a namespace file."""
    fake = FakeKube(token="test-sa-token")
    runner = web.AppRunner(fake.app(), shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    (tmp_path / "token").write_text(fake.token + "\n")
    (tmp_path / "namespace").write_text(fake.namespace)
    settings = {
        "api_url": f"http://127.0.0.1:{port}",
        "token_file": str(tmp_path / "token"),
        "ca_file": None,
        "namespace_file": str(tmp_path / "namespace"),
        "retry_max_s": 0.5,
    }
    yield fake, settings
    fake.close_watches()
    await runner.cleanup()
