"""The Prometheus endpoint (`/metrics`) as an aiohttp app on the server's event loop (non-blocking I/O)."""

from __future__ import annotations

import ssl
from collections.abc import Callable, Sequence
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
        self._middlewares = list(middlewares)
        self._extra_routes = extra_routes
        self._ssl = ssl_context
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self._registry)
        if self._registry is not REGISTRY:
            body += generate_latest(REGISTRY)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self) -> None:
        app = web.Application(middlewares=self._middlewares)
        app.router.add_get("/metrics", self._metrics)
        if self._extra_routes is not None:
            self._extra_routes(app)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port, ssl_context=self._ssl)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else self._port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
