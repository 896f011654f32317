"""An aiohttp application served on a free loopback port for the length of a block (tests' and benchmarks' fake
model servers, metrics pages, tokenizers)."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator

from aiohttp import web


@contextlib.asynccontextmanager
async def serve_app(
    app: web.Application, *, ssl_context: ssl.SSLContext | None = None, access_log: bool = True
) -> AsyncIterator[int]:
    """Serve `app` on 127.0.0.1 at a free port, yielded; stopped (connections closed) when the block ends."""
    runner = web.AppRunner(app) if access_log else web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
        await site.start()
        yield int(runner.addresses[0][1])
    finally:
        await runner.cleanup()
