"""A real headless Chromium (Debian's), driven over the DevTools protocol with aiohttp: load a page, list every
request the page made, evaluate a script in it, take a screenshot.

Chromium runs with the flags this machine needs (no sandbox as root, no GPU, none of its own background
traffic) and a fresh profile, and its DevTools endpoint on a free loopback port that it picks itself.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--mute-audio",
    "--hide-scrollbars",
]


def _console(p: dict[str, Any]) -> str:
    if p.get("type") != "error":
        return ""
    return " ".join(str(a.get("value", a.get("description"))) for a in p.get("args", []))


def _log(p: dict[str, Any]) -> str:
    entry = p.get("entry", {})
    return str(entry.get("text", "")) if entry.get("level") == "error" else ""


ERRORS = {  # what a page said went wrong, by event
    "Runtime.exceptionThrown": lambda p: str(p.get("exceptionDetails", {}).get("exception", {}).get("description")),
    "Runtime.consoleAPICalled": _console,
    "Log.entryAdded": _log,
}


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Page:
    """One tab, its requests recorded from before it navigates."""

    def __init__(self, browser: Browser, session: str) -> None:
        self.browser, self.session = browser, session
        self.requests: list[str] = []
        self.errors: list[str] = []  # uncaught exceptions, console errors, refused loads (CSP)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        return await self.browser.send(method, params, self.session)

    async def load(self, url: str, width: int = 1340, height: int = 900) -> None:
        await self.send(
            "Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False
        )
        loaded = self.browser.expect("Page.loadEventFired", self.session)
        await self.send("Page.navigate", url=url)
        await asyncio.wait_for(loaded, 60)

    async def evaluate(self, expression: str) -> Any:
        """The expression's value (a promise's, once it settles)."""
        answer = await self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in answer:
            raise RuntimeError(f"script failed: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    async def until(self, expression: str, timeout: float = 60) -> Any:
        """The expression's value once it is truthy (the page works on its own clock: its polls, its fetches)."""
        deadline = time.monotonic() + timeout
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"not true within {timeout:g}s: {expression}")
            await asyncio.sleep(0.05)  # a condition to look at again, not a wait standing in for one

    async def screenshot(self, scale: float = 1.0, height: int | None = None) -> bytes:
        """The whole page (or its top `height` pixels) as PNG, scaled down by `scale`."""
        size = await self.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
        clip = {"x": 0, "y": 0, "width": size[0], "height": height or size[1], "scale": scale}
        shot = await self.send("Page.captureScreenshot", format="png", clip=clip, captureBeyondViewport=True)
        return base64.b64decode(shot["data"])


class Browser:
    """`async with Browser() as browser: page = await browser.page()`."""

    def __init__(self) -> None:
        self.ids = itertools.count(1)
        self.waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.expected: list[tuple[str, str | None, asyncio.Future[dict[str, Any]]]] = []
        self.pages: dict[str, Page] = {}

    async def __aenter__(self) -> Browser:
        path = chromium_path()
        if path is None:
            raise RuntimeError("no chromium on PATH")
        self.profile = tempfile.mkdtemp(prefix="agentroll-chromium-")
        self.proc = subprocess.Popen(
            [path, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-port=0", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and len(port_file.read_text().split()) == 2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start (exit {self.proc.poll()})")
            await asyncio.sleep(0.05)  # another process's start-up: a file to look at again
        port, path_part = port_file.read_text().split()
        self.http = aiohttp.ClientSession()
        self.ws = await self.http.ws_connect(f"ws://127.0.0.1:{port}{path_part}", max_msg_size=0)
        self.reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.reader.cancel()
        await self.ws.close()
        await self.http.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    async def _read(self) -> None:
        async for message in self.ws:
            data = json.loads(message.data)
            if "id" in data:
                future = self.waiting.pop(data["id"], None)
                if future is not None and not future.done():
                    future.set_result(data)
                continue
            session, method = data.get("sessionId"), data.get("method")
            if method == "Network.requestWillBeSent" and session in self.pages:
                self.pages[session].requests.append(data["params"]["request"]["url"])
            elif session in self.pages and method in ERRORS:
                said = ERRORS[method](data.get("params", {}))
                if said:
                    self.pages[session].errors.append(said)
            for entry in list(self.expected):
                if entry[0] == method and entry[1] in (None, session) and not entry[2].done():
                    entry[2].set_result(data.get("params", {}))
                    self.expected.remove(entry)

    def expect(self, method: str, session: str | None) -> asyncio.Future[dict[str, Any]]:
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.expected.append((method, session, future))
        return future

    async def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> Any:
        number = next(self.ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiting[number] = future
        message: dict[str, Any] = {"id": number, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        await self.ws.send_str(json.dumps(message))
        answer = await asyncio.wait_for(future, 60)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer["result"]

    async def page(self) -> Page:
        """A new tab whose every request is recorded (Network.requestWillBeSent), from before its first load."""
        target = await self.send("Target.createTarget", {"url": "about:blank"})
        attached = await self.send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})
        page = self.pages[attached["sessionId"]] = Page(self, attached["sessionId"])
        for domain in ("Network.enable", "Page.enable", "Runtime.enable", "Log.enable"):
            await page.send(domain)
        return page
