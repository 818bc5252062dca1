"""`agentroll view DIR`: the page and its data, served over HTTP on loopback.

The server serves no file: every answer is made from the index (rows, a group's data read back from its
shard, a record's raw line, a search), each group named by its number in the list, never by a path, so nothing
outside the folder can be reached through it. It binds 127.0.0.1 unless told otherwise, and answers only
requests addressed to a loopback name (`Host: 127.0.0.1`, `localhost`, `[::1]`, any port, so that an ssh tunnel
works), which keeps a web page from reading it through a rebound DNS name. The page's script is allowed by its
hash; it may talk to this server only.
"""

from __future__ import annotations

import asyncio
import ipaddress
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from ...errors import OutputError, UsageError
from ...folder.places import Moved
from .index import Index
from .page import page

ROWS = 5000  # rows per answer: the page asks again for the rest (a folder's list is paged by shards of rows)
LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})
HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
}


def loopback(host: str) -> bool:
    if host in LOOPBACK:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """`Host`'s name without its port (`[::1]:80` -> `::1`)."""
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json", headers=HEADERS)


def _number(request: web.Request, name: str) -> int:
    try:
        value = int(request.query.get(name, "0"))
    except ValueError:
        raise web.HTTPBadRequest(text=f"{name} is not a whole number") from None
    if value < 0:
        raise web.HTTPBadRequest(text=f"{name} is negative")
    return value


class ViewServer:
    """The app over an `Index`; `start` serves it from a thread (tests, the CLI), `url` once it listens."""

    def __init__(self, index: Index, host: str = "127.0.0.1", port: int = 0, allowed: frozenset[str] = LOOPBACK):
        self.index, self.host, self.port = index, host, port
        self.allowed = allowed | {host}
        self.checked = loopback(host)  # bound elsewhere by the user's choice: any name may reach it
        self.url: str | None = None
        self.html, self.csp = page(None)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    @web.middleware
    async def guard(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        name = _host_name(request.headers.get("Host", ""))
        if self.checked and name not in self.allowed:
            return web.Response(status=403, text="this viewer answers requests to a loopback address only\n")
        return await handler(request)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.guard])
        app.router.add_get("/", self.home)
        app.router.add_get("/api/status", self.status)
        app.router.add_get("/api/rows", self.rows)
        app.router.add_get("/api/group", self.group)
        app.router.add_get("/api/raw", self.raw)
        app.router.add_get("/api/search", self.search)
        return app

    async def home(self, request: web.Request) -> web.Response:
        return web.Response(
            text=self.html,
            content_type="text/html",
            charset="utf-8",
            headers={**HEADERS, "Content-Security-Policy": self.csp},
        )

    async def status(self, request: web.Request) -> web.Response:
        return _json(self.index.status())

    async def rows(self, request: web.Request) -> web.Response:
        start, moved = _number(request, "start"), _number(request, "moved")
        body = self.index.rows_after(start, moved, ROWS)
        return web.Response(body=body, content_type="application/json", headers=HEADERS)

    async def _blocking(self, work: Callable[[], Any]) -> web.Response:
        try:
            return _json(await asyncio.get_running_loop().run_in_executor(None, work))
        except IndexError:
            return _json({"error": "no such group or record (the list changed: reload)"}, 404)
        except Moved as exc:
            return _json({"error": str(exc), "moved": True}, 409)
        except OutputError as exc:
            return _json({"error": str(exc)}, 500)

    async def group(self, request: web.Request) -> web.Response:
        number = _number(request, "n")
        return await self._blocking(lambda: self.index.group(number))

    async def raw(self, request: web.Request) -> web.Response:
        number, at = _number(request, "n"), _number(request, "at")
        return await self._blocking(lambda: self.index.raw(number, at))

    async def search(self, request: web.Request) -> web.Response:
        query = request.query.get("q", "")
        if not query.strip():
            return _json({"q": query, "groups": None, "more": False})

        def look() -> dict[str, Any]:
            found, more = self.index.search(query)
            return {"q": query, "groups": found, "more": more}

        return await self._blocking(look)

    async def serve(self) -> str:
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise UsageError(
                f"cannot listen on {self.host}:{self.port} ({exc.strerror or exc}): pass --port N, or --port 0 "
                "for any free port"
            ) from None
        bound = self._runner.addresses[0]
        host = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        self.url = f"http://{host}:{bound[1]}/"
        return self.url

    def start(self) -> str:
        """Serve from a background thread; the URL once it listens (a `UsageError` when it cannot)."""
        ready = threading.Event()
        failed: list[BaseException] = []

        def main() -> None:
            loop = self._loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(self.serve())
            except BaseException as exc:
                failed.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup() if self._runner else asyncio.sleep(0))
            loop.close()

        self._thread = threading.Thread(target=main, name="agentroll-view", daemon=True)
        self._thread.start()
        ready.wait()
        if failed:
            raise failed[0]
        assert self.url is not None
        return self.url

    def stop(self) -> None:
        self.index.stop.set()
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop = None
