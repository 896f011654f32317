"""The Prometheus endpoint (`/metrics`) as an aiohttp app on the server's event loop (non-blocking I/O).

The page is rendered on one worker thread, not on the event loop: rendering is CPU work proportional to the number
of series, and requests must not wait behind a scrape. (prometheus_client's metrics take their own locks, so the
loop keeps recording while the thread renders.)
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest


class MetricsHTTP:
    """Serves the request metrics' registry plus the process-global one (scheduler, data layer, KV pool,
    flow control and process metrics register there)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str,
        port: int,
        *,
        middlewares: Sequence[Any] = (),
        extra_routes: Callable[[web.Application], None] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._registry = registry
        self._host = host
        self._port = port
        self.middlewares = list(middlewares)  # may be added to until start()
        self._extra_routes = extra_routes
        self.ssl_context = ssl_context
        self._runner: web.AppRunner | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="metrics-render")
        self.port = 0

    def render(self) -> bytes:
        body = generate_latest(self._registry)
        if self._registry is not REGISTRY:
            body += generate_latest(REGISTRY)
        return body

    async def _metrics(self, request: web.Request) -> web.Response:
        body = await asyncio.get_running_loop().run_in_executor(self._executor, self.render)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self) -> None:
        app = web.Application(middlewares=self.middlewares)
        app.router.add_get("/metrics", self._metrics)
        if self._extra_routes is not None:
            self._extra_routes(app)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port, ssl_context=self.ssl_context)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else self._port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        self._executor.shutdown(wait=False, cancel_futures=True)
