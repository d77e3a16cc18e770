"""Driving Debian's headless Chromium over the DevTools protocol (a WebSocket), for page tests
that type, click and take screenshots: ``async with browser(tmp) as page: ...``."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import itertools
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image
from websockets.asyncio.client import ClientConnection, connect

__all__ = ["Page", "browser", "chromium"]

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
    "--remote-debugging-port=0",
)


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("the browser tests need Debian's chromium (apt-get install chromium)")


class Page:
    """One tab: commands by id, events ignored."""

    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for raw in self._ws:
            message = json.loads(raw)
            future = self._waiting.pop(message.get("id", -1), None)
            if future is not None and not future.done():
                future.set_result(message)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        ident = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[ident] = future
        await self._ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        message = await asyncio.wait_for(future, timeout=30)
        if "error" in message:
            raise AssertionError(f"{method}: {message['error']}")
        result: dict[str, Any] = message.get("result", {})
        return result

    async def eval(self, expression: str) -> Any:
        result = await self.send(
            "Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True
        )
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, within_s: float = 20) -> Any:
        """Poll ``expression`` until it is truthy; its value."""
        deadline = asyncio.get_running_loop().time() + within_s
        while True:
            value = await self.eval(expression)
            if value:
                return value
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"timed out waiting for {expression}")
            await asyncio.sleep(0.1)

    async def goto(self, url: str) -> None:
        await self.send("Page.navigate", url=url)
        await self.wait_for("document.readyState === 'complete'")

    async def _center(self, selector: str) -> tuple[float, float]:
        rect = await self.eval(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        return float(rect[0]), float(rect[1])

    async def click(self, selector: str) -> None:
        """A real mouse click in the middle of the element."""
        x, y = await self._center(selector)
        for kind in ("mousePressed", "mouseReleased"):
            await self.send(
                "Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1
            )

    async def type_into(self, selector: str, text: str) -> None:
        """Replace the field's text as typing would (the page sees ``input`` events)."""
        await self.click(selector)
        await self.eval(f"document.querySelector({json.dumps(selector)}).select()")
        await self.send("Input.insertText", text=text)

    async def screenshot(self, path: Path, selector: str | None = None) -> Image.Image:
        """A PNG of the page, or of one element, saved to ``path`` and returned decoded."""
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": True}
        if selector is not None:
            box = await self.eval(
                f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
                " e.scrollIntoView({block: 'start'}); const r = e.getBoundingClientRect();"
                " return [r.x + scrollX, r.y + scrollY, r.width, r.height]; })()"
            )
            x, y, w, h = (float(v) for v in box)
            params["clip"] = {"x": x, "y": y, "width": w, "height": h, "scale": 1}
        data = (await self.send("Page.captureScreenshot", **params))["data"]
        png = base64.b64decode(data)
        await asyncio.to_thread(path.write_bytes, png)
        return Image.open(io.BytesIO(png)).convert("RGB")

    async def aclose(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader
        await self._ws.close()


@contextlib.asynccontextmanager
async def browser(profile: Path, width: int = 1280, height: int = 1600) -> AsyncIterator[Page]:
    await asyncio.to_thread(profile.mkdir, parents=True, exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        chromium(),
        *FLAGS,
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
        "about:blank",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        for _ in range(300):  # up to 30 s
            if port_file.exists() and port_file.read_text().strip():
                break
            await asyncio.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        async with httpx.AsyncClient() as http:
            targets = (await http.get(f"http://127.0.0.1:{port}/json/list")).json()
        url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        async with connect(url, max_size=None) as ws:
            page = Page(ws)
            try:
                await page.send("Page.enable")
                await page.send(
                    "Emulation.setDeviceMetricsOverride",
                    width=width,
                    height=height,
                    deviceScaleFactor=1,
                    mobile=False,
                )
                yield page
            finally:
                await page.aclose()
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), timeout=10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
